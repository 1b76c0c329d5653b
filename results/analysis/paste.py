"""The code to paste for a recommended configuration: DDP's keyword arguments, the communication hook, the
compile settings in PyTorch's documented order, the `no_sync()` pattern and the environment variables, each
line as the sweep measured it (`results.analysis.recommend` sets it beside every curve's verdict)."""

from __future__ import annotations

import re
import shlex

from results.analysis import identity

ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")  # a variable's name (results.storage.reader drops rows with any other)
FIRST = ("bucket_cap_mb", "gradient_as_bucket_view")  # always written; DDP's other keywords only off their default


def snippet(cfg: dict, gas: int, env: dict[str, str], *, cuda: bool = True) -> str:
    """The code to paste: DDP's keyword arguments (device_ids only on CUDA: DDP must not get them on CPU), the
    no_sync pattern where it wins, environment variables. Stored rows are data, never code: a variable's name is
    written only when it is a name (the reader drops rows with any other), its value shell-quoted, every Python
    value with repr(), numbers through a number format."""
    lines = [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items()) if ENV_NAME.fullmatch(k)]
    if lines:
        lines.append("")
    kwargs = ["device_ids=[local_rank]"] if cuda else []
    kwargs += [
        f"bucket_cap_mb={cfg['bucket_cap_mb']:g}",
        f"gradient_as_bucket_view={bool(cfg['gradient_as_bucket_view'])}",
    ]
    kwargs += [
        f"{k.ddp_kwarg}={cfg[k.name]!r}"
        for k in identity.CHOSEN
        if k.ddp_kwarg and k.name not in FIRST and cfg[k.name] != k.pytorch
    ]
    if cfg["first_bucket_mb"] is not None:  # PyTorch 2.13: per-bucket caps, the first one smaller
        kwargs.append(f"bucket_cap_mb_list=[{cfg['first_bucket_mb']:g}, {cfg['bucket_cap_mb']:g}]")
    lines += _compile_mode_lines(cfg)
    lines.append(f"model = DistributedDataParallel(model, {', '.join(kwargs)})")
    lines += _hook_lines(cfg) + _compile_lines(cfg)
    if cfg["no_sync"] and gas > 1:
        lines += [
            f"# {gas} micro-steps per optimizer step: all-reduce only on the last (DDP's no_sync())",
            "for i, batch in enumerate(micro_batches):",
            "    last = i == len(micro_batches) - 1",
            "    with contextlib.nullcontext() if last else model.no_sync():",
            f"        (loss_fn(model, batch) / {gas}).backward()",
            "optimizer.step()",
        ]
    return "\n".join(lines)


def _compile_mode_lines(cfg: dict) -> list[str]:
    """Before wrapping: DDP reads optimize_ddp when it is constructed (the Python reducer) and when it compiles."""
    if not cfg.get("compile"):
        return []
    lines = [f"torch._dynamo.config.optimize_ddp = {cfg['optimize_ddp']!r}"]
    if cfg["optimize_ddp"] == "python_reducer":
        lines.append("torch._dynamo.config.compiled_autograd = True  # the Python reducer needs compiled autograd")
    return lines


def _compile_lines(cfg: dict) -> list[str]:
    """After wrapping: compile the DDP-wrapped model (PyTorch's documented order)."""
    if not cfg.get("compile"):
        return []
    args = [f"backend={cfg['compile_backend']!r}"] if cfg["compile_backend"] != "inductor" else []
    args += [f"mode={cfg['compile_mode']!r}"] if cfg["compile_mode"] not in (None, "default") else []
    line = f"model = torch.compile({', '.join(['model', *args])})"
    if cfg["optimize_ddp"] == "python_reducer":
        line += "  # call loss.backward() inside a torch.compile'd function, or within"
        return [line, "# torch._dynamo.compiled_autograd._enable(torch.compile) around each micro-step, as measured"]
    return [line]


def _hook_lines(cfg: dict) -> list[str]:
    """Registering the recommended communication hook (none: nothing to add)."""
    hooks = "torch.distributed.algorithms.ddp_comm_hooks"
    if cfg["comm_hook"] in ("fp16", "bf16"):
        name = f"{cfg['comm_hook']}_compress_hook"
        return [
            f"# changes the numerics: gradients all-reduced in {cfg['comm_hook']}",
            f"model.register_comm_hook(None, {hooks}.default_hooks.{name})",
        ]
    if cfg["comm_hook"] == "powersgd":
        return [
            f"# changes the numerics: rank-{cfg['powersgd_rank']} PowerSGD with error feedback",
            f"from {hooks} import powerSGD_hook as powerSGD",
            "state = powerSGD.PowerSGDState(process_group=None, "
            f"matrix_approximation_rank={int(cfg['powersgd_rank'])}, "
            "start_powerSGD_iter=1000)  # PyTorch's advice: a plain warm-up first",
            "model.register_comm_hook(state, powerSGD.powerSGD_hook)",
        ]
    return []

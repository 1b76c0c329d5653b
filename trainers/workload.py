"""What is measured: a workload. The GPT presets are built-in workloads; a user's model is one by import path.

The contract (docs: "Your own model"): a spec names `workload: "package.module:factory"` and
`workload_args: {...}`; on every rank the harness seeds torch with the cell's seed, then calls
`factory(**workload_args)`, which returns an object with

- `model`: an `nn.Module` built on CPU (the harness moves it to the device and copies it per cell);
- `make_batch(micro_batch: int, generator: torch.Generator) -> tuple[Tensor, ...]`: one micro-batch on
  CPU (the harness moves it; each rank's generator is seeded from (seed, rank, micro-step));
- `loss(model, batch) -> Tensor`: a scalar loss (`model` is what forward must run through: the DDP
  wrapper in ddp mode);
- optionally `tokens_per_sample: int` (tokens/s is reported where it is given; samples/s always).

The workload never knows about parallelism: wrapping, timing, checks and reports are the harness's.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from trainers.config import StepConfig
from trainers.errors import ALLOW_WORKLOAD_ENV, ConfigError
from trainers.model import GPT, PRESETS


class Workload(Protocol):
    """The object a workload factory returns (see the module docstring)."""

    model: nn.Module

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]: ...

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor: ...


@dataclass
class GPTWorkload:
    """A GPT preset behind the workload contract: random token ids, next-token cross-entropy."""

    model: GPT
    seq_len: int  # tokens per sample

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = self.model.cfg.vocab_size
        xy = torch.randint(0, vocab, (2, micro_batch, self.seq_len), generator=generator)  # (2, B, T)
        return xy[0], xy[1]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y = batch  # (B, T) token ids, (B, T) targets
        return model(x, y)


@dataclass
class Built:
    """A workload built for one device: the object and its model there (every cell copies it)."""

    workload: Any
    model: nn.Module
    tokens_per_sample: int | None


SHIPPED = "sweeps.examples"  # ddpsweep's own example workloads


def library_module(module_name: str) -> str | None:
    """What `module_name` is when it is not the user's own code: "the standard library" or "an installed
    distribution" (its top-level package under site-packages), else None. Nothing is imported: the top-level
    name's spec is found without running it."""
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return "the standard library"
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    where = list(spec.submodule_search_locations or []) + [spec.origin or ""] if spec else []
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    if any(w and any(os.path.realpath(w).startswith(os.path.realpath(r) + os.sep) for r in roots) for w in where):
        return "an installed distribution"
    return None


def refused(path: str) -> str | None:
    """Why the factory `path` is not run: a module of the standard library or an installed distribution, unless
    allowed (ALLOW_WORKLOAD_ENV, `--allow-workload`) or ddpsweep's own examples; checked before anything is imported."""
    module_name = path.partition(":")[0]
    allowed = {m.strip() for m in os.environ.get(ALLOW_WORKLOAD_ENV, "").split(",") if m.strip()}
    if module_name == SHIPPED or module_name.startswith(SHIPPED + ".") or module_name in allowed:
        return None
    what = library_module(module_name)
    if what is None:
        return None
    return f"a module of your own: {module_name} is {what} (name it with --allow-workload {module_name} to run it)"


def load_factory(path: str):
    """The factory named by `package.module:attr` (the working directory is importable too, as for
    `python -m`: a workload file beside the spec works from the `ddpsweep` script)."""
    module_name, _, attr = path.partition(":")
    if attr.startswith("_"):
        raise ConfigError("workload", path, "a public factory: a name that does not start with '_'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    why = refused(path)
    if why is not None:
        raise ConfigError("workload", path, why)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("workload", path, f"an importable module ({e})") from e
    except (Exception, SystemExit) as e:  # its code failed as it ran (a syntax error, an exception, exit())
        raise ConfigError("workload", path, f"a module that imports: {where(e)}") from e
    factory = inspect.getattr_static(module, attr, None)  # nothing of the module runs to look it up
    if not (inspect.isfunction(factory) or inspect.isclass(factory)):
        raise ConfigError("workload", path, f"a function or class {attr!r} defined in module {module_name}")
    home = getattr(factory, "__module__", "") or ""
    if home != module_name and not home.startswith(module_name + "."):
        raise ConfigError(
            "workload",
            path,
            f"a factory defined in {module_name} (or a module under it): {attr} is {home}'s; a module's imports "
            f"are not workloads (name it {home}:{attr} if that module is yours)",
        )
    return factory


def create(cfg: StepConfig) -> Any:
    """The cell's workload object, on CPU, built after seeding torch with the cell's seed (same weights on
    every rank)."""
    torch.manual_seed(cfg.seed)
    if cfg.workload is None:
        return GPTWorkload(model=GPT(PRESETS[cfg.model]), seq_len=cfg.seq_len)
    args = json.loads(cfg.workload_args)
    factory = load_factory(cfg.workload)
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as e:
        raise ConfigError("workload_args", args, f"the factory's keyword arguments ({e})") from None
    except ValueError:
        pass  # no signature to check against (a builtin): the call says
    try:
        obj = factory(**args)
    except (Exception, SystemExit) as e:
        raise ConfigError("workload", cfg.workload, f"a factory that returns its workload: {where(e)}") from e
    check(obj, cfg.workload)
    return obj


def where(e: BaseException) -> str:
    """`SyntaxError: invalid syntax (models.py, line 3)`: an exception in user code as one line, where it was
    raised in the user's file (the traceback's last frame outside ddpsweep and the standard library)."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if "importlib" not in f.filename and "/trainers/" not in f.filename]
    at = f" ({mine[-1].filename}, line {mine[-1].lineno})" if mine else ""
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}{': ' + text if text else ''}{at}"


def check(obj: Any, path: str) -> None:
    """ConfigError naming what the object returned by the factory lacks."""
    if not isinstance(getattr(obj, "model", None), nn.Module):
        raise ConfigError("workload", path, "a factory whose result has `model`, an nn.Module")
    for name in ("make_batch", "loss"):
        if not callable(getattr(obj, name, None)):
            raise ConfigError("workload", path, f"a factory whose result has a `{name}` method")
    if not any(p.requires_grad for p in obj.model.parameters()):
        raise ConfigError("workload", path, "a model with trainable parameters")
    tps = getattr(obj, "tokens_per_sample", None)
    if tps is not None and (isinstance(tps, bool) or not isinstance(tps, int) or tps < 1):
        raise ConfigError("workload.tokens_per_sample", tps, "an integer >= 1, or absent")


def build(cfg: StepConfig, device: torch.device) -> Built:
    """The workload for `cfg` with its model on `device`; ConfigError if its fingerprint is not the one the
    sweep planned (the module changed between planning and running)."""
    obj = create(cfg)
    fp = fingerprint(obj.model)
    if cfg.workload_fingerprint is not None and fp != cfg.workload_fingerprint:
        raise ConfigError(
            "workload", cfg.workload, f"the model the sweep planned (fingerprint {cfg.workload_fingerprint})"
        )
    model = obj.model.to(device)  # in place: nn.Module.to returns the module itself
    return Built(workload=obj, model=model, tokens_per_sample=getattr(obj, "tokens_per_sample", None))


def fingerprint(model: nn.Module) -> str:
    """A hash of the parameter names, shapes and dtypes, in registration order (12 hex digits)."""
    spec = [(name, list(p.shape), str(p.dtype).removeprefix("torch.")) for name, p in model.named_parameters()]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:12]


class _NoInit(TorchFunctionMode):
    """On the meta device, in-place ops (the initialisers: `normal_`, `zero_`, `nn.init.*`) return their tensor
    unchanged: there are no values to fill, and a meta `normal_` otherwise imports torch._dynamo (1-2 s a
    process, the planning step's largest cost). Ops that change the tensor's own shape run as usual."""

    RESHAPING = frozenset(
        {"resize_", "resize_as_", "unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_"}
        | {"as_strided_", "set_"}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by keyword
        in_place = name.endswith("_") and not name.endswith("__") and name not in self.RESHAPING
        if in_place and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=8)
def planned(cfg: StepConfig) -> tuple[str, tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(fingerprint, shapes of the trainable parameters, bytes of every parameter in order) of `cfg`'s workload,
    computed where the sweep is planned: on the meta device (no memory, no init) where the factory allows it,
    else on CPU."""
    try:
        with torch.device("meta"), _NoInit():
            model = create(cfg).model
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 — a factory that needs real tensors: build it for real
        model = create(cfg).model
    shapes = tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)
    return fingerprint(model), shapes, tuple(p.numel() * p.element_size() for p in model.parameters())


def planned_fingerprint(cfg: StepConfig) -> str:
    return planned(cfg)[0]


def useful_powersgd_rank(shapes: tuple[tuple[int, ...], ...], min_compression_rate: float = 2.0) -> int:
    """The largest PowerSGD rank at which some gradient is still compressed: PowerSGD sends an (n, m) matrix
    (a tensor viewed as n x the rest) as rank-r factors only if (n + m) * r * min_compression_rate < n * m
    (its _should_compress; 2 is PowerSGDState's default), and 1-D tensors never. 0: nothing ever is."""
    best = 0
    for shape in shapes:
        if len(shape) < 2:
            continue
        n, m = shape[0], math.prod(shape[1:])
        best = max(best, math.ceil(n * m / (min_compression_rate * (n + m))) - 1)
    return best


def generator(seed: int, rank: int, micro: int) -> torch.Generator:
    """The data generator of one rank's micro-step: seeded from (seed, rank, micro-step)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank * 1_009 + micro + 1) % (1 << 63))

"""A compiled cell: `torch.compile` around the cell's module, DDP's compile modes, and what compiling cost.

PyTorch's documented pattern is compiling the DDP-wrapped model; `torch._dynamo.config.optimize_ddp` picks how
Dynamo treats DDP (trainers.knobs.OPTIMIZE_DDP). The mode is process-global and read when DDP is constructed
(the Python reducer) and at every compilation (the graph split), so a cell sets it before wrapping and keeps
it until it is released; `use` restores what it changed (the mode, the Python reducer's Inductor flags and its
trace rule). Each cell starts from `torch._dynamo.reset()`: Dynamo's in-memory code cache would otherwise
gather one entry per cell's wrapper and, past its recompile limit, run later cells eagerly without a word.
Inductor's on-disk cache (FX graphs, kernels) is kept, so a repeat of a cell compiles from it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainers.config import StepConfig
from trainers.errors import StepError

MAX_COMPILE_STEPS = 8
"""Warm-up steps beyond `warmup_steps` a compiled cell may take to stop recompiling; then the cell fails."""
COLLECTIVE_OP = "c10d::allreduce_"  # the dispatcher's all-reduce: every backend, eager, traced and hooked alike


@dataclass
class GraphCounter:
    """The backend torch.compile gets: the cell's backend, counting every graph handed to it (with
    `ddp_optimizer`, one per split; with the Python reducer, the forward and compiled autograd's backward)."""

    backend: str
    mode: str
    graphs: int = 0
    inner: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.backend == "inductor":
            self.inner = torch._TorchCompileInductorWrapper(self.mode, None, False)
        else:
            self.inner = torch._dynamo.lookup_backend(self.backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        return self.inner(gm, example_inputs)


@dataclass
class Compiled:
    """A compiled cell's state on one rank."""

    counter: GraphCounter
    python_reducer: bool  # compiled autograd around every micro-step

    def step_context(self) -> contextlib.AbstractContextManager:
        """What a micro-step runs in: compiled autograd for the Python reducer (it traces the all-reduces into
        the backward graph), else nothing."""
        if not self.python_reducer:
            return nullcontext()
        return torch._dynamo.compiled_autograd._enable(torch.compile(backend=self.counter))

    def activity(self) -> int:
        """Graphs and frames compiled so far in this process: unchanged over a step that compiled nothing."""
        return self.counter.graphs + frames_compiled()


def frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


@contextlib.contextmanager
def use(cfg: StepConfig) -> Iterator[None]:
    """The cell's Dynamo settings, from before its wrapper is built until it is released (eager: nothing)."""
    if not cfg.compile:
        yield
        return
    import torch._dynamo
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    saved = (inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size)
    inline = torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST
    had_rule = "torch.nn.parallel.distributed" in inline
    try:
        with torch._dynamo.config.patch(optimize_ddp=cfg.optimize_ddp or "ddp_optimizer"):
            yield
    finally:
        inductor._fuse_ddp_communication, inductor._fuse_ddp_bucket_size = saved
        if not had_rule:
            inline.discard("torch.nn.parallel.distributed")
            torch._dynamo.trace_rules.get_legacy_mod_inlinelist.cache_clear()
        torch._dynamo.reset()


def compile_module(module: nn.Module, cfg: StepConfig) -> tuple[nn.Module, Compiled]:
    """`torch.compile(module)` with the cell's backend and mode (the wrapper: DDP(model), or the bare model)."""
    counter = GraphCounter(cfg.compile_backend, cfg.compile_mode)
    return torch.compile(module, backend=counter), Compiled(counter, cfg.optimize_ddp == "python_reducer")


def warm_up(step: Callable[[], None], steps: int, compiled: Compiled | None, agree: Callable[[bool], bool]) -> float:
    """`steps` untimed steps; a compiled cell steps on until a step compiles nothing on any rank (`agree`: the
    ranks' verdicts, or-ed), at most MAX_COMPILE_STEPS more. Returns the seconds of the steps that compiled."""
    if compiled is None:
        for _ in range(steps):
            step()
        return 0.0
    compile_s = 0.0
    for i in range(steps + MAX_COMPILE_STEPS):
        before, t0 = compiled.activity(), time.perf_counter()
        step()
        changed = compiled.activity() != before
        compile_s += (time.perf_counter() - t0) if changed else 0.0
        if i + 1 >= max(steps, 2) and not agree(changed):
            return compile_s
    raise StepError(
        f"the compiled step still recompiled after {steps + MAX_COMPILE_STEPS} warm-up steps (warmup_steps "
        f"{steps} + MAX_COMPILE_STEPS {MAX_COMPILE_STEPS}); run with TORCH_LOGS=recompiles to see why"
    )


def count_collectives(step: Callable[[], Any]) -> tuple[int, Any]:
    """(all-reduce calls in one run of `step`, counted by the profiler; what `step` returned). Untimed: never
    a measured step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = step()
    return sum(1 for e in prof.events() if e.name == COLLECTIVE_OP), result

"""Run a function on a real gloo world of processes (torch.multiprocessing, no Ray).

The world's processes stay up between calls, as a sweep's warm worker group does: a fresh pair of processes
costs ~2 s to import torch and the test module, and a first DDP wrapper ~1.5 s more (it imports
torch._dynamo), on every call; the tier made ~30 such calls. Each call still gets a process group of its
own (a new file store), a random seed for the default generator as a fresh process has, and one thread
per rank. A rank
that raises, or a world that does not answer in time, is ended; the next call starts a new one.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CALL_TIMEOUT_S = 300  # one call's limit on every rank; a collective waits at most COLLECTIVE_TIMEOUT_S
COLLECTIVE_TIMEOUT_S = 120


class RankFailed(RuntimeError):
    """A rank raised (the message carries its traceback) or the world did not answer in time."""


def _call(rank: int, world_size: int, fn: Callable, workdir: str, args: tuple, call: int) -> None:
    torch.seed()  # a random seed, as a fresh process has (what an earlier call drew is no state of this one)
    torch.set_num_threads(1)
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = f"file://{workdir}/store-{call}"  # a new file per call: no key of an earlier world is read
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        out = fn(rank, *args)
        torch.save(out, f"{workdir}/out{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _serve(rank: int, world_size: int, inbox, outbox) -> None:
    """One rank of the world: run each call that arrives until told to stop (None)."""
    import torch.nn.parallel  # noqa: F401 — what every DDP call needs, once per process

    while (job := inbox.get()) is not None:
        try:
            _call(rank, world_size, *job)
            outbox.put((rank, None))
        except BaseException:  # noqa: BLE001 — sent to the caller, which raises it
            outbox.put((rank, traceback.format_exc()))
        sys.stdout.flush()
        sys.stderr.flush()
    # Skip interpreter teardown (as trainers.bench does): a c10d/gloo thread still joinable when its object is
    # destroyed at exit aborts the process now and then ("terminate called without an active exception").
    os._exit(0)


class _World:
    def __init__(self, world_size: int) -> None:
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.calls = 0
        self.inboxes = [ctx.Queue() for _ in range(world_size)]
        self.outbox = ctx.Queue()
        self.procs = [
            ctx.Process(target=_serve, args=(r, world_size, self.inboxes[r], self.outbox), daemon=True)
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable, workdir: Path, args: tuple) -> None:
        self.calls += 1
        for inbox in self.inboxes:
            inbox.put((fn, str(workdir), args, self.calls))
        failures = []
        for _ in range(self.world_size):
            try:
                rank, error = self.outbox.get(timeout=CALL_TIMEOUT_S if not failures else 10)
            except queue.Empty:
                failures.append("a rank did not answer (hung in a collective its peer left?)")
                break
            if error is not None:
                failures.append(f"rank {rank} raised:\n{error}")
        if failures:
            raise RankFailed("\n".join(failures))

    def close(self, wait: bool = True) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for p in self.procs:
            p.join(timeout=10 if wait else 0)
            if p.is_alive():
                p.kill()


_WORLDS: dict[int, _World] = {}


def run_world(fn: Callable, world_size: int, workdir: Path, *args: Any) -> list[Any]:
    """Run fn(rank, *args) on every rank; return each rank's return value (saved with torch.save)."""
    workdir.mkdir(parents=True, exist_ok=True)
    world = _WORLDS.get(world_size)
    if world is None:
        world = _WORLDS[world_size] = _World(world_size)
    try:
        world.run(fn, workdir, args)
    except BaseException:
        _WORLDS.pop(world_size).close(wait=False)  # a failed world may hold half a collective: never reuse it
        raise
    return [torch.load(workdir / f"out{r}.pt", weights_only=False) for r in range(world_size)]


@atexit.register
def _close_worlds() -> None:
    for world in _WORLDS.values():
        world.close()
    _WORLDS.clear()

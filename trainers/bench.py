"""The reference measurement: one cell under torchrun (or plain python for `single`).

    torchrun --standalone --nproc_per_node=2 -m trainers.bench --model tiny --bucket-cap-mb 25 --gas 4 --no-sync

Prints one JSON line on rank 0: the StepConfig, the world size and the Measurement. Exit code 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

from trainers.config import MODES, StepConfig
from trainers.errors import ConfigError
from trainers.knobs import COMPILE_BACKENDS, OPTIMIZE_DDP
from trainers.presets import PRESETS
from trainers.step import run_cell


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m trainers.bench", description=__doc__.split("\n")[0])
    d = StepConfig()
    ap.add_argument("--model", default=d.model, help=f"preset: {', '.join(PRESETS)}")
    ap.add_argument("--mode", default=d.mode, help=f"one of {', '.join(MODES)}")
    ap.add_argument("--micro-batch", type=int, default=d.micro_batch)
    ap.add_argument("--seq-len", type=int, default=d.seq_len)
    ap.add_argument("--gas", type=int, default=d.gas)
    ap.add_argument("--no-sync", action="store_true", help="no_sync() on the first gas-1 micro-steps")
    ap.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    ap.add_argument("--no-gradient-as-bucket-view", action="store_true")
    ap.add_argument("--warmup", type=int, default=d.warmup_steps)
    ap.add_argument("--steps", type=int, default=d.timed_steps, help="timed steps (adaptive: the batch size)")
    ap.add_argument("--trace-comm", action="store_true", help="record each bucket's all-reduce timeline")
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP-wrapped model")
    ap.add_argument("--optimize-ddp", default="ddp_optimizer", help=f"with --compile: one of {', '.join(OPTIMIZE_DDP)}")
    ap.add_argument("--compile-backend", default="inductor", help=f"with --compile: {', '.join(COMPILE_BACKENDS)}")
    ap.add_argument("--compile-mode", default="default", help="with --compile: torch.compile's mode")
    ap.add_argument("--target-rel-ci", type=float, default=None, help="adaptive: stop at a ±fraction interval")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per rank (default: cores / local ranks)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    return ap.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> StepConfig:
    return StepConfig(
        model=args.model,
        mode=args.mode,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        gas=args.gas,
        no_sync=args.no_sync,
        bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=not args.no_gradient_as_bucket_view,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        target_rel_ci=args.target_rel_ci,
        trace_comm=args.trace_comm,
        compile=args.compile,
        optimize_ddp=args.optimize_ddp,
        compile_backend=args.compile_backend,
        compile_mode=args.compile_mode,
    )


def pick_device(choice: str) -> torch.device:
    use_cuda = torch.cuda.is_available() if choice == "auto" else choice == "cuda"
    if not use_cuda:
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


def init_distributed(device: torch.device) -> None:
    """Join torchrun's group, or make a world of one when run as plain python."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = config_from_args(args)
        if args.threads is not None and args.threads < 1:
            raise ConfigError("threads", args.threads, "an integer >= 1")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", "cuda", "auto or cpu: this machine has no CUDA device")
        if cfg.mode == "single" and int(os.environ.get("WORLD_SIZE", 1)) > 1:
            raise ConfigError("mode", "single", "single runs one process: use --nproc_per_node=1 or plain python")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    device = pick_device(args.device)
    if cfg.mode != "single":
        init_distributed(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    try:
        result = run_cell(cfg, device, threads)
    finally:
        if dist.is_initialized():
            dist.barrier()  # no rank tears gloo down while a peer still talks to it
            dist.destroy_process_group()
    if result is not None:
        row = dataclasses.asdict(cfg) | {"world_size": world} | result.to_dict()
        row["tokens_per_step"] = cfg.tokens_per_rank * world
        row["torch_version"] = torch.__version__
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: now and then a c10d/gloo
    # thread is still joinable when its object is destroyed at exit, and C++ aborts the process
    # ("terminate called without an active exception") after the row was printed.
    os._exit(code)

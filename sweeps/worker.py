"""Runs on every Ray Train worker: the measured cell, then placement and fingerprint (rank 0 returns)."""

from __future__ import annotations

import os
import socket
import time

import ray
import ray.train
import ray.train.torch
import torch.distributed as dist

from sweeps import fingerprint
from trainers.config import StepConfig
from trainers.step import run_cell


def _placement() -> list[list[str]]:
    """[(hostname, node_id)] of every rank, in rank order."""
    mine = [socket.gethostname(), ray.get_runtime_context().get_node_id()]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


# Fault-injection hook for tests of the error paths: a file whose lines are "<cell_id> raise|hang".
FAULT_FILE_ENV = "DDPSWEEP_FAULT_FILE"


def _injected_fault(cell_id: str) -> None:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        faults = dict(line.split() for line in f if line.strip())
    if faults.get(cell_id) == "raise":
        raise RuntimeError(f"fault injected into cell {cell_id}")
    if faults.get(cell_id) == "hang":
        time.sleep(10**6)


def train_fn_per_worker(config: dict) -> dict | None:
    """Measure the cell on this rank; rank 0 returns {result, placement, fingerprint}."""
    _injected_fault(config.get("cell_id", ""))
    cfg = StepConfig(**config["step"])
    device = ray.train.torch.get_device()
    result = run_cell(cfg, device, num_threads=config["threads"])
    placement = _placement()
    if ray.train.get_context().get_world_rank() != 0:
        return None
    return {"result": result.to_dict(), "placement": placement, "fingerprint": fingerprint.collect(device)}

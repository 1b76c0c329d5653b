"""Runs on every Ray Train worker: the measured cell, then placement and fingerprint (rank 0 returns)."""

from __future__ import annotations

import os
import socket

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


FAULT_ENV = "DDPSWEEP_FAULT_CELL"  # testing hook: a worker of this cell id raises, as a real bug would


def train_fn_per_worker(config: dict) -> dict | None:
    """Measure the cell on this rank; rank 0 returns {result, placement, fingerprint}."""
    if config.get("cell_id") and os.environ.get(FAULT_ENV) == config["cell_id"]:
        raise RuntimeError(f"fault injected into cell {config['cell_id']} ({FAULT_ENV})")
    cfg = StepConfig(**config["step"])
    device = ray.train.torch.get_device()
    result = run_cell(cfg, device, num_threads=config["threads"])
    placement = _placement()
    if ray.train.get_context().get_world_rank() != 0:
        return None
    return {"result": result.to_dict(), "placement": placement, "fingerprint": fingerprint.collect(device)}

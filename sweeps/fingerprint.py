"""The cluster fingerprint of a measurement: what hardware and software produced a row.

Collected on the rank-0 worker after the timed steps (never inside them).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata

import torch

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "OMP_NUM_THREADS")


def _run(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist_name: str) -> str:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return ""


def _nccl_version() -> str:
    """torch reports a (major, minor, patch) tuple, older releases one int such as 21803."""
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def collect(device: torch.device) -> dict:
    """Fingerprint columns of the row schema (except `hosts`, gathered from every rank)."""
    cuda = device.type == "cuda"
    nccl = _nccl_version() if cuda else ""
    return {
        "accelerator": torch.cuda.get_device_name(device) if cuda else cpu_model(),
        "accelerators": torch.cuda.device_count() if cuda else (os.cpu_count() or 0),
        "driver_version": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0]
        if cuda
        else "",
        "cuda_version": torch.version.cuda or "",
        "nccl_version": nccl,
        "torch_version": torch.__version__,
        "ray_version": _version("ray"),
        "python_version": platform.python_version(),
        "ddpsweep_version": _version("ddpsweep"),
        "topology": _run(["nvidia-smi", "topo", "-m"]) if cuda else "",
        "env": json.dumps({k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}),
    }

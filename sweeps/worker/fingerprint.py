"""The cluster fingerprint of a measurement: what hardware and software produced a row.

Collected on the rank-0 worker after the timed steps (never inside them).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata

import torch

from sweeps.worker import bind

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "OMP_NUM_THREADS")


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi topo -m underlines its header even into a pipe


def _run(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        return ANSI.sub("", subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout).strip()
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


SOCKET_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _interfaces(node_ip: str) -> list[dict]:
    """Up, non-loopback interfaces: name, link speed (Mb/s, from /sys/class/net/*/speed where the driver
    reports it; null for virtual links), MTU, IPv4 addresses, and whether it holds the Ray node's address
    (the one gloo and NCCL reach the other nodes through unless *_SOCKET_IFNAME says otherwise)."""
    import psutil

    out = []
    stats, addrs = psutil.net_if_stats(), psutil.net_if_addrs()
    for name, st in sorted(stats.items()):
        if not st.isup or name == "lo":
            continue
        ips = [a.address for a in addrs.get(name, []) if a.family.name == "AF_INET"]
        speed = _read(f"/sys/class/net/{name}/speed")
        out.append(
            {
                "name": name,
                "speed_mbps": int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                "mtu": st.mtu,
                "ipv4": ips,
                "node_ip": node_ip in ips,
            }
        )
    return out


def _infiniband() -> list[dict]:
    """InfiniBand / RoCE devices (/sys/class/infiniband): each port's state, rate and link layer."""
    root, out = "/sys/class/infiniband", []
    for dev in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for port in sorted(os.listdir(f"{root}/{dev}/ports")) if os.path.isdir(f"{root}/{dev}/ports") else []:
            base = f"{root}/{dev}/ports/{port}"
            out.append(
                {
                    "device": dev,
                    "port": port,
                    "state": _read(f"{base}/state"),
                    "rate": _read(f"{base}/rate"),
                    "link_layer": _read(f"{base}/link_layer"),
                }
            )
    return out


def network(node_ip: str) -> dict:
    """This node's network fingerprint: interfaces and their speeds, IB/RoCE ports, the socket / IB
    variables in force, GPUs and the `nvidia-smi topo -m` matrix where present."""
    env = {k: v for k, v in sorted(os.environ.items()) if k in SOCKET_ENV or k.startswith("NCCL_IB_")}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "node_ip": node_ip,
        "interfaces": _interfaces(node_ip),
        "infiniband": _infiniband(),
        "env": env,
        "gpus": gpus,
        "gpu_topology": _run(["nvidia-smi", "topo", "-m"]) if gpus else "",
    }


def _configured_env() -> dict[str, str]:
    """The NCCL/GLOO variables in force that the cluster or the spec set; those the harness set are not the
    configuration (sweeps.worker.bind.SET_BY_HARNESS)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and k not in bind.SET_BY_HARNESS}


def collect(device: torch.device, given: dict[str, str] | None = None) -> dict:
    """Fingerprint columns of the row schema (except `hosts`, gathered from every rank). `env`: the NCCL/GLOO
    variables in force on the worker, those the spec set (`given`) as the spec wrote them: a value the process
    saw differently (Ray expands ${VAR} from the cluster's environment) is never recorded."""
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
        "torch_version": str(torch.__version__),  # a plain str: TorchVersion would import torch where unpickled
        "ray_version": _version("ray"),
        "python_version": platform.python_version(),
        "ddpsweep_version": _version("ddpsweep"),
        "topology": _run(["nvidia-smi", "topo", "-m"]) if cuda else "",
        "env": json.dumps(dict(sorted((_configured_env() | (given or {})).items()))),
    }

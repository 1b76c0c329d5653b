"""Runs on every rank before its first process group: gloo bound to the interface that holds the Ray node's IP.

Gloo picks its interface from the hostname unless GLOO_SOCKET_IFNAME names one (a single name, not NCCL's `^lo`
syntax). On clusters where the hostname resolves to loopback or to another network, every gloo group (the CPU
groups, and the gradient check's on any cluster) fails at start-up with "connectFullMesh failed". The Ray node's
IP is the address the other nodes reach this one at, so its interface is the one to bind.
"""

from __future__ import annotations

import os

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


def interface_of(ip: str) -> str | None:
    """The name of the interface that holds `ip` (IPv4 or IPv6), or None."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs):
            return name
    return None


def bind_gloo(node_ip: str) -> str | None:
    """Set GLOO_SOCKET_IFNAME to the interface holding `node_ip`, unless the environment (the spec's `env`)
    already sets it; returns the name in force."""
    if os.environ.get(GLOO_IFNAME):
        return os.environ[GLOO_IFNAME]
    name = interface_of(node_ip)
    if name is not None:
        os.environ[GLOO_IFNAME] = name
    return name

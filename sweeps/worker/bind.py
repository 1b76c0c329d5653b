"""Runs on every rank before its first process group: gloo bound to the interface that holds the Ray node's IP.

Gloo picks its interface from the hostname unless GLOO_SOCKET_IFNAME names one (a single name, not NCCL's `^lo`
syntax). On clusters where the hostname resolves to loopback or to another network, every gloo group (the CPU
groups, and the gradient check's on any cluster) fails at start-up with "connectFullMesh failed". The Ray node's
IP is the address the other nodes reach this one at, so its interface is the one to bind.

Variables the harness sets on a rank this way are its own, not the configuration measured: rows never record them
in `env`, so a recommendation never tells a user to export them (an interface name of one node, our NCCL fault
handling).
"""

from __future__ import annotations

import os

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
SET_BY_HARNESS: set[str] = set()  # the variables this process's harness set (neither the spec nor the cluster did)


def harness_default(name: str, value: str) -> str:
    """Set `name` unless the environment (the spec's `env`, the cluster's) already does (an empty value counts as
    unset); returns the value in force."""
    if not os.environ.get(name):
        os.environ[name] = value
        SET_BY_HARNESS.add(name)
    return os.environ[name]


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
    return name if name is None else harness_default(GLOO_IFNAME, name)

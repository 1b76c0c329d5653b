"""Why a worker group never started: the signal that killed a worker process and the last lines of its stderr.

Ray Train reports a worker that crashed (a segfault in a library, an abort) as "A worker health check
failed … The actor died unexpectedly", naming its pid and node but not what killed it. Python's faulthandler
(on in Ray's workers) writes "Fatal Python error: Segmentation fault" and the Python stack to the worker's
stderr; Ray's state API (served by the dashboard) reads that file on whichever node it is.
"""

from __future__ import annotations

import re

SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
WORKER = re.compile(r"node_ip='([^']+)',\s*pid=(\d+)")
TAIL = 8  # stack lines kept: the innermost frames


def explain(message: str) -> str:
    """`message` led by what killed the worker where Ray's error names a dead worker process and its stderr says
    why (the signal, and the innermost frames of the Python stack); `message` as it is otherwise."""
    found = WORKER.search(message)
    if found is None or "died" not in message:
        return message
    lines = stderr_tail(found[1], int(found[2]))
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")), None)
    if fatal is None:
        return message
    what = lines[fatal].removeprefix("Fatal Python error:").strip()
    signal = next((sig for text, sig in SIGNALS.items() if text in what), "a fatal error")
    stack = [line.strip() for line in lines[fatal + 1 :] if line.strip().startswith("File ")][:TAIL]
    head = f"a worker process (pid {found[2]}) died of {signal} ({what}); innermost frames:\n  "
    return head + "\n  ".join(stack) + f"\n(Ray: {message.splitlines()[0][:300]})"


def stderr_tail(node_ip: str, pid: int, lines: int = 200) -> list[str]:
    """The last `lines` lines of a worker process's stderr through Ray's state API ([] where it cannot be read:
    no dashboard, the node gone)."""
    try:
        import ray
        from ray.util.state import get_log

        # this session's cluster by name: without it Ray looks for one on this machine and refuses when a second
        # runs here (a `ray start` cluster beside the embedded one)
        address = ray.get_runtime_context().gcs_address
        text = "".join(get_log(address=address, node_ip=node_ip, pid=pid, suffix="err", tail=lines, timeout=10))
    except Exception:  # noqa: BLE001 — the explanation is a help; Ray's own message stands without it
        return []
    return text.splitlines()

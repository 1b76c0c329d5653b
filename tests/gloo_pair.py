"""One rank of a two-rank gloo world, run inside a network namespace by tests/test_two_nodes.py:

    python tests/gloo_pair.py RANK NODE_IP STORE_ADDR bind|nobind

`bind`: gloo bound to the interface holding NODE_IP (sweeps.worker.bind), as every rank of a sweep is; `nobind`: gloo's
own choice (the hostname's address). Prints the all-reduced sum over a group of the default one and a second
gloo group (the gradient check's kind), or the error."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sweeps.worker.bind import bind_gloo  # noqa: E402

TIMEOUT_S = {"bind": 20, "nobind": 4}  # nobind is expected to fail: it need not wait long to


def main(rank: int, node_ip: str, store: str, how: str) -> None:
    if how == "bind":
        print("bound to", bind_gloo(node_ip), flush=True)
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S[how])
        )
        group = dist.new_group(backend="gloo")
        x = torch.ones(4) * (rank + 1)
        dist.all_reduce(x, group=group)
        print("sum", float(x[0]), flush=True)
    except Exception as e:  # noqa: BLE001 — printed for the test to read
        print("error", type(e).__name__, str(e).splitlines()[0][:300], flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])

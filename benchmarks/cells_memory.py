"""What a store of N rows costs the server, and what one large /cells download adds.

    python benchmarks/cells_memory.py                   # 100,000 and 500,000 rows
    python benchmarks/cells_memory.py --rows 20000      # quicker

For each size: one sweep of N rows (the seed post's rows through the real row schema, repeated, written as one
compacted Parquet file), `ddpsweep serve` in a subprocess, then
1. the server's RSS once it holds the rows (after a request that loads them): the memory per stored row;
2. its peak RSS while `/cells?sweep=…` (JSON) streams to /dev/null, sampled every 20 ms, and the bytes sent;
3. the same for `format=csv`.
Every figure printed is measured in this run, on this machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results.storage.schema import row_table  # noqa: E402
from tests.ray_head import free_port  # noqa: E402
from tests.seed_rows import seed_rows  # noqa: E402

TOKEN = "bench"


def generate(root: str, rows: int) -> str:
    """One sweep of `rows` rows, as one compacted file; its sweep id."""
    base = pa.concat_tables([row_table(r | {"step_times_ms": [r["step_ms"]] * 30}) for r in seed_rows()])
    reps = -(-rows // base.num_rows)
    table = pa.concat_tables([base] * reps).slice(0, rows)
    ids = pa.array([f"c{i % 997}" for i in range(rows)])
    table = table.set_column(table.schema.get_field_index("cell_id"), "cell_id", ids)
    repeat = pa.array([i // 997 for i in range(rows)], pa.int32())
    table = table.set_column(table.schema.get_field_index("repeat"), "repeat", repeat)
    folder = Path(root) / "cluster=pcie-8x" / "sweep=seed"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "compacted.parquet", compression="zstd")
    return "seed"


def serve(root: str, rows: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "service.cli", "serve", "--results", root, "--port", str(port)]
    cmd += ["--token", TOKEN, "--max-rows", str(rows + 1)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(f"{base}/openapi.json", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("serve did not start")


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss  # bytes


def peak_while(pid: int, fn) -> tuple[int, object]:
    """(peak RSS in bytes while fn() runs, its result), sampled every 20 ms."""
    peak, done = [rss(pid)], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(rss(pid))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = fn()
    finally:
        done.set()
        t.join()
    return max(peak), out


def download(url: str) -> int:
    sent = 0
    with httpx.stream("GET", url, timeout=600) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            sent += len(chunk)
    return sent


def one(rows: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        sweep = generate(root, rows)
        made = time.perf_counter() - t0
        proc, base = serve(root, rows)
        try:
            idle = rss(proc.pid)
            httpx.get(f"{base}/ui/sweeps.json", timeout=600).raise_for_status()  # loads every row
            held = rss(proc.pid)
            print(
                f"{rows:,} rows (written in {made:.1f} s): server RSS {idle / 2**20:.0f} MiB idle, "
                f"{held / 2**20:.0f} MiB holding them: {(held - idle) / rows:.0f} bytes a row"
            )
            for fmt in ("json", "csv"):
                peak, sent = peak_while(proc.pid, lambda f=fmt: download(f"{base}/cells?sweep={sweep}&format={f}"))
                print(
                    f"  /cells {fmt}: {sent / 2**20:.0f} MiB sent; peak RSS {peak / 2**20:.0f} MiB "
                    f"(+{(peak - held) / 2**20:.0f} MiB over holding the rows)"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="*", default=[100_000, 500_000])
    args = parser.parse_args()
    print(f"cells_memory: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    for rows in args.rows:
        one(rows)


if __name__ == "__main__":
    main()

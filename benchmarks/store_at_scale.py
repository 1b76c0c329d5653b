"""Results at scale: a generated store of many rows, read uncompacted and compacted, side by side.

    python benchmarks/store_at_scale.py                 # 100,000 rows (writing them takes a few minutes)
    python benchmarks/store_at_scale.py --rows 20000    # quicker
    python benchmarks/store_at_scale.py --rows 9900 --no-http   # the CLI's latency on a packed store

Rows are built through the real row schema (results.storage.schema.row_table via Store.write_row) from the seed
post's measurements, spread over clusters and sweeps of 100 rows. Printed, each measured in this run:
1. `ddpsweep query "select count(*) from cells"` end to end (a subprocess): uncompacted (one file per
   row), compacted (one file per sweep) and packed (one file per cluster, `ddpsweep compact`); then, on the
   packed store, `ddpsweep --help` and that query interleaved 7 times (the console script, fresh processes);
2. the previous sequential reader (one file after another) on a 5,000-file subset, and the current
   parallel reader on the same subset, as the reference;
3. the HTTP API (`ddpsweep serve` in a subprocess) over the compacted store: median and p99 latency of
   `/cells?cluster=…&sweep=…` and `/query`, 200 requests at concurrency 10 after the first load, then
   the same while a writer adds rows to the store.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import compaction, reader  # noqa: E402
from results.storage.schema import conform  # noqa: E402
from results.storage.store import Store  # noqa: E402
from tests.ray_head import free_port  # noqa: E402
from tests.seed_rows import seed_rows  # noqa: E402

ROWS_PER_SWEEP = 100
CLUSTERS = 5


def synthetic_row(i: int, base: list[dict]) -> dict:
    sweep = i // ROWS_PER_SWEEP
    row = dict(base[i % len(base)])
    row.update(
        cluster=f"bench-{sweep % CLUSTERS}",
        sweep_id=f"s{sweep:05d}",
        cell_id=f"c{i % ROWS_PER_SWEEP:03d}",
        repeat=0,
        step_ms=row["step_ms"] * (1 + 0.01 * random.random()),
    )
    return row


def generate(root: str, rows: int) -> float:
    store, base = Store.open(root), seed_rows()
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.write_row(synthetic_row(i, base)), range(rows)))
    return time.perf_counter() - start


def cli_query(root: str, sql: str = "select count(*) from cells") -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "query", sql, "--results", root, "--format", "csv"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    return time.perf_counter() - start, out.strip().splitlines()[-1]


def cli_latency(root: str, n: int = 7) -> None:
    """`ddpsweep --help` and `ddpsweep query "select count(*) from cells"` end to end (the console script, each a
    fresh process), interleaved n times: the medians and ranges."""
    exe = str(Path(sys.executable).parent / "ddpsweep")
    commands = {
        "ddpsweep --help": [exe, "--help"],
        "ddpsweep query count(*)": [exe, "query", "select count(*) from cells", "--results", root],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, cwd=tempfile.gettempdir())
            times[name].append(time.perf_counter() - start)
    for name, ts in times.items():
        print(f"{name:<26} median {statistics.median(ts):5.2f} s  [{min(ts):.2f}, {max(ts):.2f}] over {n} runs")


def sequential_reader(store: Store, paths: list[str]) -> float:
    """The plain reader: one pq.read_table after another, each conformed, then concatenated."""
    start = time.perf_counter()
    pa.concat_tables([conform(pq.read_table(p, filesystem=store.fs)) for p in paths])
    return time.perf_counter() - start


def latencies(base_url: str, paths: list[str], token: str, n: int = 200, concurrency: int = 10) -> list[float]:
    import httpx

    def one(i: int) -> float:
        path = paths[i % len(paths)]
        start = time.perf_counter()
        if path.startswith("/query"):
            auth = {"Authorization": f"Bearer {token}"}
            r = client.post("/query", json={"sql": path[len("/query ") :]}, headers=auth)
        else:
            r = client.get(path)
        r.raise_for_status()
        return (time.perf_counter() - start) * 1e3

    with httpx.Client(base_url=base_url, timeout=120) as client, ThreadPoolExecutor(concurrency) as pool:
        return sorted(pool.map(one, range(n)))


def serve(root: str, token: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--results", root]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "DDPSWEEP_TOKEN": token}, stderr=subprocess.DEVNULL)
    import httpx

    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2)
            return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def http_section(root: str, rows: int) -> None:
    token = "bench"
    proc, url = serve(root, token)
    try:
        sweeps = rows // ROWS_PER_SWEEP
        paths = [f"/cells?cluster=bench-{s % CLUSTERS}&sweep=s{s:05d}" for s in random.sample(range(sweeps), 20)]
        queries = ["/query select count(*) from cells", "/query select cluster, median(step_ms) from cells group by 1"]
        first = latencies(url, paths[:1], token, n=1, concurrency=1)[0]
        print(f"HTTP first request (loads the store)     {first:9.1f} ms")
        for label, writer in (("idle store", False), ("a sweep writing rows", True)):
            stop = threading.Event()
            thread = threading.Thread(target=_writer, args=(root, rows, stop), daemon=True) if writer else None
            if thread:
                thread.start()
            cells, sql = latencies(url, paths, token), latencies(url, queries, token)
            stop.set()
            for name, ms in (("/cells?cluster&sweep", cells), ("/query", sql)):
                print(f"HTTP {name:22s} {label:22s} median {statistics.median(ms):8.1f} ms   p99 {p(ms, 0.99):8.1f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _writer(root: str, rows: int, stop: threading.Event) -> None:
    store, base, i = Store.open(root), seed_rows(), rows
    while not stop.is_set():
        store.write_row(synthetic_row(i, base) | {"sweep_id": "s-live", "cluster": "bench-0", "cell_id": f"l{i}"})
        i += 1
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--keep", help="generate into (or reuse) this folder instead of a temporary one")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP API section")
    args = parser.parse_args()
    random.seed(0)
    root = args.keep or tempfile.mkdtemp(prefix="ddpsweep-scale-")
    try:
        store = Store.open(root)
        if not store.files():
            print(f"generated {args.rows} row files in {generate(root, args.rows):.1f} s")
        files = store.files()
        print(f"store: {len(files)} files, {args.rows // ROWS_PER_SWEEP} sweeps, {CLUSTERS} clusters")
        subset = random.sample(files, min(5000, len(files)))
        for path in subset:  # both readers on the same files, in the page cache: the readers' own cost
            Path(path).read_bytes()
        seq = sequential_reader(store, subset)
        start = time.perf_counter()
        now = reader.combine(reader.read_files(store.fs, subset))
        par = time.perf_counter() - start
        assert now.num_rows == len(subset)
        print(
            f"reader, {len(subset)} files (warm page cache): sequential (before) {seq:6.2f} s   "
            f"parallel (now) {par:6.2f} s   ratio {seq / par:5.1f}x"
        )
        t_uncompacted, count = cli_query(root)
        print(f"ddpsweep query count(*), {len(files)} files (uncompacted): {t_uncompacted:6.2f} s -> {count}")
        start = time.perf_counter()
        done = [compaction.compact_sweep(store, c, s) for c, sweeps in store.labels().items() for s in sweeps]
        print(f"compaction of {len(done)} sweeps: {time.perf_counter() - start:6.2f} s")
        t_compacted, count2 = cli_query(root)
        print(
            f"ddpsweep query count(*), {len(store.files())} files (a file per sweep): {t_compacted:6.2f} s -> {count2}"
        )
        start = time.perf_counter()
        packs = [compaction.compact_cluster(store, c) for c in store.labels()]
        print(f"packing of {len(packs)} clusters: {time.perf_counter() - start:6.2f} s")
        t_packed, count3 = cli_query(root)
        print(
            f"ddpsweep query count(*), {len(store.files())} files (a pack per cluster): {t_packed:6.2f} s -> {count3}"
        )
        assert count == count2 == count3, (count, count2, count3)
        cli_latency(root)
        if not args.no_http:
            http_section(root, args.rows)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

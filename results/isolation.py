"""Limits a query cannot escape: the address space of the process that runs it, a deadline that kills it,
and a bound on the bytes of its result.

DuckDB's `memory_limit` covers its buffer manager, not list functions or huge strings (`len(range(4e8))`
took a server to 15.6 GB), and its interrupt is not honoured inside them. So:

- the CLI (one query, then exit) limits its own data segment (`RLIMIT_DATA`: DuckDB then fails the
  allocation with an OutOfMemoryException, a clean QueryError) and holds a hard deadline that ends the
  process with one line and exit 2 if an interrupt is not honoured;
- the server runs every query in a child forked from a forkserver that has the query code imported (about
  30 ms a query): the child maps the server's cached rows from Arrow IPC files (written once per snapshot),
  builds the views it needs, runs the query under the same memory limit, and sends its result as
  Arrow IPC of at most MAX_RESULT_BYTES; the server kills it at the deadline. A bomb costs the child, never
  the server, and the analysis views (bootstraps) are inside the deadline too.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pandas as pd
import pyarrow as pa

from results.errors import QueryError

MEMORY_BUDGET_BYTES = 2 * 2**30  # address space a query may add to what its process holds at the start
MAX_RESULT_BYTES = 64 * 2**20  # Arrow bytes of one result (the rendered response is bounded by RENDER_FACTOR)
GRACE_S = 2.0  # past the deadline, before the process is killed


@contextmanager
def memory_limited(budget: int = MEMORY_BUDGET_BYTES) -> Iterator[None]:
    """limit_address_space for the block, then the previous limit again (a process that goes on after the
    query, and the children it starts later, e.g. a test runner's browser, must not inherit the cap)."""
    before = resource.getrlimit(resource.RLIMIT_DATA)
    limit_address_space(budget)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, before)


def limit_address_space(budget: int = MEMORY_BUDGET_BYTES) -> None:
    """Cap this process's writable private memory (RLIMIT_DATA: heap and anonymous mappings, what a query
    allocates) at what it holds now plus `budget`; never raises the hard limit. RLIMIT_AS would also count
    the address space that allocators and thread pools reserve without using (a gigabyte here)."""
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = size + budget if hard == resource.RLIM_INFINITY else min(hard, size + budget)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


@contextmanager
def hard_deadline(seconds: float, on_expiry: Callable[[], None]) -> Iterator[None]:
    """Call `on_expiry` (which should end the process) if the block is still running `seconds` from now."""
    timer = threading.Timer(seconds, on_expiry)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["results.query"])
    return ctx


def query_in_child(rows_ipc: str, calibration_ipc: str, sql: str, *, timeout_s: float, max_rows: int) -> pd.DataFrame:
    """Run `sql` over the rows and calibration in the two Arrow IPC files, in a child process under the
    limits above; the result as a DataFrame, or QueryError."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    limits = (timeout_s, max_rows, MAX_RESULT_BYTES)  # read here: the child does not share this module's state
    child = ctx.Process(target=_child_main, args=(send, rows_ipc, calibration_ipc, sql, limits), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s + GRACE_S):
            raise QueryError(f"query exceeded the time limit of {timeout_s:g} s")
        kind, payload = receive.recv()
    except EOFError:
        raise QueryError("query ran out of memory (its process was ended); aggregate or add a LIMIT") from None
    finally:
        child.kill()
        child.join()
        receive.close()
    if kind == "error":
        raise QueryError(payload)
    return to_frame(pa.ipc.open_stream(payload).read_all())


def _child_main(send, rows_ipc: str, calibration_ipc: str, sql: str, limits: tuple[float, int, int]) -> None:
    from results import query as query_mod

    timeout_s, max_rows, max_bytes = limits
    try:
        limit_address_space()
        rows = pa.ipc.open_file(pa.memory_map(rows_ipc)).read_all()
        calibration = pa.ipc.open_file(pa.memory_map(calibration_ipc)).read_all().to_pandas()
        frames = query_mod.views_of(rows, calibration, sql)
        table = query_mod.query_arrow(sql, frames, timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes)
        send.send(("ok", to_ipc(table, max_bytes)))
    except QueryError as e:
        send.send(("error", str(e)))
    except MemoryError:
        send.send(("error", "query ran out of memory; aggregate or add a LIMIT"))
    except Exception as e:  # noqa: BLE001 — the server answers with one line, never a traceback
        send.send(("error", query_mod.scrub(f"{type(e).__name__}: {str(e)[:300]}")))
    finally:
        send.close()


def to_ipc(table: pa.Table, max_bytes: int = MAX_RESULT_BYTES) -> bytes:
    """The result as Arrow IPC bytes; QueryError past `max_bytes`."""
    if table.nbytes > max_bytes:
        raise QueryError(f"result too large: over {max_bytes / 2**20:g} MiB; select fewer columns or rows")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def to_frame(table: pa.Table) -> pd.DataFrame:
    """A result as a DataFrame; a column pandas cannot hold faithfully is a QueryError naming it."""
    try:
        return table.to_pandas()
    except (pa.ArrowException, ValueError, OverflowError, TypeError) as e:
        bad = next((f.name for f in table.schema if not _converts(table, f.name)), "?")
        raise QueryError(f"column {bad!r}: its type cannot be returned ({str(e)[:120]}); cast it to text") from None


def _converts(table: pa.Table, name: str) -> bool:
    try:
        table.select([name]).to_pandas()
    except (pa.ArrowException, ValueError, OverflowError, TypeError):
        return False
    return True


def write_ipc(table: pa.Table, path: str) -> None:
    """A table as an Arrow IPC file that children memory-map (written under a temporary name, then renamed)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)

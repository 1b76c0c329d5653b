"""Limits a query cannot escape: the address space of the process that runs it, a deadline that kills it,
and a bound on the bytes of its result.

DuckDB's `memory_limit` covers its buffer manager, not list functions or huge strings (`len(range(4e8))`
took a server to 15.6 GB), and its interrupt is not honoured inside them. So:

- the CLI (one query, then exit) limits its own data segment (`RLIMIT_DATA`: DuckDB then fails the
  allocation with an OutOfMemoryException, a clean QueryError) and holds a hard deadline that ends the
  process with one line and exit 2 if an interrupt is not honoured;
- the server runs every query in a child forked from a forkserver that has the query code imported (about
  30 ms a query: run_in_child, used by results.sql.query.query_in_child) under the same memory limit; the
  server kills it at the deadline, and the result comes back as Arrow IPC of at most MAX_RESULT_BYTES. A bomb
  costs the child, never the server.

This module knows nothing of queries: results.sql.query uses it.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

from results.errors import QueryError

if TYPE_CHECKING:
    import pandas as pd

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
    the address space that allocators and thread pools reserve without using."""
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


def run_in_child(fn: Callable[..., object], args: tuple, *, timeout_s: float, preload: tuple[str, ...] = ()) -> object:
    """`fn(*args)` in a child forked from a forkserver (that has `preload` imported) under limit_address_space;
    its picklable result. The child is killed `GRACE_S` past `timeout_s` (QueryError), and a child that dies,
    out of memory, is a QueryError too. `fn` must answer its own errors (a child's exception is lost)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s + GRACE_S):
            raise QueryError(f"query exceeded the time limit of {timeout_s:g} s")
        return receive.recv()
    except EOFError:
        raise QueryError("query ran out of memory (its process was ended); aggregate or add a LIMIT") from None
    finally:
        child.kill()
        child.join()
        receive.close()


def _child_main(send, fn: Callable[..., object], args: tuple) -> None:
    try:
        limit_address_space()
        send.send(fn(*args))
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

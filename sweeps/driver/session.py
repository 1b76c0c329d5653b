"""The driver's Ray session and the signals that stop a sweep.

Ctrl-C (SIGINT) and SIGTERM (kill, systemd, Kubernetes, Ray Jobs' stop) both end a sweep as an interrupt:
rows already written stay, the CLI prints the command that resumes it (exit 130 or 143). Three rules keep
that clean:
- an interrupt that arrives while `ray.init` starts the embedded Ray is held until it is up (interrupted
  half-way, the driver crashed at exit with a segfault and left Ray's agents running);
- while Ray shuts down, further Ctrl-C are ignored (a second one printed a traceback from Ray's shutdown);
- after the embedded Ray's shutdown, what is left of its processes is ended (sweeps.driver.machine).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from sweeps.driver import machine
from sweeps.spec.fields import SpecError
from trainers.errors import ClusterUnreachable


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so the sweep stops as on Ctrl-C (rows kept, a resume command)."""


_TERMINATED: list[bool] = []  # SIGTERM arrived (Ray or Tune may re-raise it as a plain KeyboardInterrupt)
_SIGTERM_WANTED: list[bool] = []  # the CLI asked for it: installed again after ray.init, which replaces it
_TOKEN_ASKED: list[bool] = []  # this session joined a cluster with RAY_AUTH_MODE=token in its environment


def _on_sigterm(signum, frame) -> None:
    _TERMINATED[:] = [True]
    raise Terminated()


def terminated() -> bool:
    """Whether this process got SIGTERM (so an interrupt exits 143, not 130)."""
    return bool(_TERMINATED)


def raise_if_terminated() -> None:
    """Raise Terminated if SIGTERM arrived: its handler's exception can be swallowed on the way out (Ray's
    C++ wait loop turns it into a status; a sweep once ran to the end and exited 0 after a SIGTERM)."""
    if _TERMINATED:
        raise Terminated()


def raise_on_sigterm() -> None:
    """Make SIGTERM raise Terminated in the main thread (Ray's driver installs its own handler, which dumps
    a C++ trace and exits 134: this one is installed again once Ray is up)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        _SIGTERM_WANTED[:] = [True]


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM during the block and raise them once it has finished."""
    if not _main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        if not held:
            print("\nstopping once Ray has started (a few seconds) ...", file=sys.stderr, flush=True)
        held.append(signum)

    before = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if held:
        if signal.SIGTERM in held:
            _TERMINATED[:] = [True]
            raise Terminated()
        raise KeyboardInterrupt()


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ignore Ctrl-C during the block (Ray's shutdown must not be cut half-way)."""
    if not _main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextmanager
def environment_kept() -> Iterator[None]:
    """The process's environment as it was before the block, once it ends: ray.init leaves RAY_AUTH_MODE=token
    behind (and _init sets two variables of its own), so a later session, or a process started from this one (a
    CLI test's subprocess), would ask a cluster without auth for a token, and its trials would never start."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextmanager
def ray_session(address: str | None, verbose: bool) -> Iterator[None]:
    """Attach to `address` (or the job's cluster via RAY_ADDRESS), or start an embedded local Ray."""
    if ray.is_initialized():
        yield
        return
    quiet = {"log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.ERROR}
    embedded = not (address or os.environ.get("RAY_ADDRESS"))
    _TOKEN_ASKED[:] = [not embedded and os.environ.get("RAY_AUTH_MODE", "").lower() == "token"]
    with environment_kept():
        try:
            with interrupts_held():
                try:
                    _init(address, embedded, quiet)
                except SystemExit as e:  # the SIGTERM handler ray.init installs first: sys.exit(15)
                    if e.code != signal.SIGTERM:
                        raise
                    _TERMINATED[:] = [True]
                    raise Terminated() from None
            if _SIGTERM_WANTED:
                raise_on_sigterm()  # ray.init replaced it
            yield
        finally:
            with interrupts_ignored():
                ours = machine.session_processes() if embedded else []
                ray.shutdown()
                machine.end_processes(ours)  # what an interrupted start or shutdown left behind


def _init(address: str | None, embedded: bool, quiet: dict) -> None:
    if not embedded:
        _join(address, quiet)
        return
    # The dashboard serves the state API that Ray Train's placement-group cleaner needs to free
    # the resources of a cell killed at cell_timeout_s; without it they stay reserved.
    # address="local": always a new embedded Ray, also when `ray start --head` runs on this machine
    # (plain ray.init() would attach to that one and refuse num_cpus). Its workers inherit this
    # environment: the working directory joins PYTHONPATH, so a workload module beside the spec imports.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    # Raylet starts a worker per CPU for the first driver; a sweep's every process asks for its own (runtime
    # environment, actor), so those would only import Ray beside the group's start (1.1 s later to the rows here)
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    dashboard = _dashboard_installed()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=dashboard, dashboard_host="127.0.0.1", **quiet)


def _join(address: str | None, quiet: dict) -> None:
    """Attach to a running cluster; a bad address or a cluster that cannot be joined is one line naming it."""
    field, given = ("--address", address) if address else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))
    try:
        ray.init(address=address, **quiet)
    except ValueError as e:
        allowed = "a Ray head as HOST:PORT (its GCS, 6379), ray://HOST:10001, or auto"
        raise SpecError(field, given, f"{allowed} ({_first_line(e)})") from None
    except (ConnectionError, RuntimeError, TimeoutError, ray.exceptions.RayError) as e:
        raise ClusterUnreachable(f"cannot join the Ray cluster at {given} ({field}): {_first_line(e)}") from None


def token_asked() -> bool:
    """Whether this driver joined a cluster asking for Ray's token auth (RAY_AUTH_MODE=token, before ray.init,
    which sets it for a cluster of its own): against a cluster started without auth, Ray joins, but every trial
    is cancelled before it starts."""
    return bool(_TOKEN_ASKED and _TOKEN_ASKED[0])


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _dashboard_installed() -> bool:
    """Whether Ray's dashboard can start here (ray[default]); a minimal Ray (the GPU check's bundle) starts
    without it: no Ray Jobs, and a cell killed at cell_timeout_s keeps its placement group reserved."""
    try:
        from ray._private.utils import get_dashboard_dependency_error
    except ImportError:  # moved in a later Ray: ask for it, as before
        return True
    return get_dashboard_dependency_error() is None

"""The HTTP server under clients that misbehave: downloads whose sockets are reset, clients that never finish
their headers or bodies, and a flood of requests that each wait on a job server that never answers. Each is
run against a real uvicorn server (service.httpserver, as `ddpsweep serve` runs it) on loopback."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest

from results.storage.store import Store
from service import api, downloads, jobs
from service.api import ServiceSettings, create_app
from tests.seed_rows import seed_rows


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _open(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_server(sock: socket.socket, within_s: float, drip: bytes = b"") -> bool:
    """Whether the server closes `sock` within `within_s` while the client sends `drip` every 0.2 s."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionError:
            return True
        try:
            if drip:
                sock.sendall(drip)
        except ConnectionError:
            return True
    return False


@pytest.fixture
def store_root(tmp_path) -> str:
    store = Store.open(str(tmp_path))
    for rep in range(3):
        for r in seed_rows():
            store.write_row(r | {"repeat": rep})
    return str(tmp_path)


def test_reset_download_sockets_give_their_slots_back(live_server, store_root, monkeypatch):
    monkeypatch.setattr(downloads, "DOWNLOAD_WAIT_S", 1.0)
    base = live_server(create_app(ServiceSettings(address=None, results=store_root, token="t")))
    for _ in range(3):  # each round would take both slots for good if a reset leaked them
        for _ in range(2):
            sock = _open(base)
            sock.sendall(b"GET /cells?format=csv HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # RST, before or while the response is written
    status, body = 503, b""
    deadline = time.monotonic() + 5
    while status != 200 and time.monotonic() < deadline:
        status, body = _get(f"{base}/cells?format=csv")
    assert status == 200 and body.count(b"\n") == 25, body[:200]  # a header and 24 rows
    time.sleep(0.5)  # every slot is back: two downloads at once are not refused
    assert downloads.DOWNLOADS.acquire(timeout=0.5) and downloads.DOWNLOADS.acquire(timeout=0.5)
    downloads.DOWNLOADS.release()
    downloads.DOWNLOADS.release()


def test_headers_never_finished_are_cut_off(live_server, store_root):
    app = create_app(ServiceSettings(address=None, results=store_root, token="t"))
    base = live_server(app, header_timeout_s=1.0)
    slow = [_open(base) for _ in range(20)]
    for sock in slow:
        sock.sendall(b"GET /cells HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert all(_closed_by_server(s, within_s=4, drip=b"X") for s in slow[:10])  # a byte at a time changes nothing
    assert all(_closed_by_server(s, within_s=1) for s in slow[10:])
    status, _ = _get(f"{base}/cells")  # a client that sends its request whole is served as before
    assert status == 200


def test_a_body_never_finished_is_a_408_and_the_connection_closes(live_server, store_root):
    settings = ServiceSettings(address=None, results=store_root, token="t", body_timeout_s=1.0)
    base = live_server(create_app(settings))
    sock = _open(base)
    head = b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\r\nContent-Length: 100\r\n\r\n"
    sock.sendall(head + b'{"sql": ')
    sock.settimeout(5)
    answer = b""
    while chunk := sock.recv(65536):  # ends when the server closes the connection
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"RequestTimeout" in answer


def _silent_server() -> tuple[socket.socket, str]:
    """A TCP server that accepts and never answers (a hung job server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held: list[socket.socket] = []

    def hold() -> None:
        with contextlib.suppress(OSError):  # the test closed the listener
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_flood_of_job_server_calls_leaves_the_dashboard_answering(live_server, store_root, monkeypatch):
    monkeypatch.setattr(jobs, "READ_TIMEOUT_S", 3.0)
    listener, address = _silent_server()
    base = live_server(create_app(ServiceSettings(address=address, results=store_root, token="t")))
    statuses: list[int] = []
    flood = [threading.Thread(target=lambda: statuses.append(_get(f"{base}/sweeps")[0])) for _ in range(60)]
    for t in flood:
        t.start()
    time.sleep(0.5)
    began = time.monotonic()
    status, _ = _get(f"{base}/ui/sweeps.json")
    took = time.monotonic() - began
    for t in flood:
        t.join(timeout=30)
    listener.close()
    assert status == 200 and took < 1.5, took
    assert statuses.count(503) >= 60 - api.JOB_CALLS, statuses  # refused at once beyond the cap
    assert len(statuses) == 60 and set(statuses) <= {503, 502, 504}, statuses

"""The HTTP server `ddpsweep serve` runs: uvicorn's h11 protocol with a deadline on each request's headers.

uvicorn times out an idle keep-alive connection, but any byte resets that timer, so a client that sends its
headers a byte at a time (or never finishes them) holds a connection and a descriptor for as long as it likes.
Here every request's headers must be complete within `header_timeout_s` of the connection opening or the
previous response ending; the body has its own deadline where it is read (service.api.read_body).
"""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # from the connection (or the previous response) to the request's last header line


class DeadlineProtocol(H11Protocol):
    """h11 with a header deadline: a request not started within the deadline closes the connection."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        timeout = getattr(self.config, "header_timeout_s", HEADER_TIMEOUT_S)
        self._awaited, self._deadline = self.cycle, self.loop.call_later(timeout, self._expire)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not self._awaited:  # a request's headers arrived: its handler runs, no deadline
            self._deadline.cancel()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request (handle_events)
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._deadline.cancel()
            self._arm()  # the next request on this connection gets the same deadline

    def _expire(self) -> None:
        if self.cycle is self._awaited and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        super().connection_lost(exc)


def config(app, host: str, port: int, header_timeout_s: float = HEADER_TIMEOUT_S) -> uvicorn.Config:
    """The uvicorn configuration `serve` (and the tests' live server) run `app` with."""
    cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", http=DeadlineProtocol)
    cfg.header_timeout_s = header_timeout_s  # read by DeadlineProtocol through its config
    return cfg

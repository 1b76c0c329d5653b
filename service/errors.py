"""The errors the edges know: the CLI turns them into `error: …` and an exit code, the HTTP API into a status.

ddpsweep's errors have two roots, because results never imports trainers: trainers.errors.DDPSweepError (the
measuring core, sweeps, the service) and results.errors.ResultsError (the store and its queries). Each class of
either tree carries `http_status`; the edges read it and never test classes one by one.
"""

from __future__ import annotations

from results.errors import ResultsError
from trainers.errors import DDPSweepError

KNOWN_ERRORS: tuple[type[Exception], ...] = (DDPSweepError, ResultsError)
"""Every error raised on purpose is an instance of one of these."""


class ApiError(DDPSweepError):
    """An error of the HTTP edge itself (auth, body size, request shape); carries its own status."""

    def __init__(self, status: int, type_: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.http_status, self.type, self.message, self.field = status, type_, message, field

"""The errors the edges know: the CLI turns them into `error: …` and exit code 2 (service.cli_common.Edge), the
HTTP API into a status (service.api), each in one handler.

ddpsweep's errors have one root, trainers.errors.DDPSweepError (results.errors.ResultsError derives from it).
Each class carries `http_status`; the edges read it and never test classes one by one.
"""

from __future__ import annotations

from trainers.errors import DDPSweepError


class ApiError(DDPSweepError):
    """An error of the HTTP edge itself (auth, body size, request shape); carries its own status."""

    def __init__(self, status: int, type_: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.http_status, self.type, self.message, self.field = status, type_, message, field

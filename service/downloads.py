"""`/cells` downloads: streamed a batch at a time, at most two built at once, each slot given back when its
response ends however it ends (sent, the client gone, the task cancelled)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.responses import Response, StreamingResponse

from results.sql.formats import to_csv
from service.errors import ApiError

DOWNLOAD_BATCH = 5_000  # rows converted at a time: a download's memory is a batch's, not the selection's
DOWNLOADS = threading.BoundedSemaphore(2)  # large responses built at once; more wait (then 503)
DOWNLOAD_WAIT_S = 30.0


class _Slot:
    """One of DOWNLOADS, released exactly once, whoever gets there first."""

    def __init__(self) -> None:
        self._held, self._lock = True, threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            DOWNLOADS.release()


class _SlotResponse(StreamingResponse):
    """A streamed download that gives its slot back when the response ends however it ends: sent, the client
    gone (a reset socket), the task cancelled, or never started (a generator's `finally` runs only if it does)."""

    def __init__(self, chunks: Iterator[str], media_type: str, slot: _Slot) -> None:
        super().__init__(chunks, media_type=media_type)
        self.slot = slot

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def download(table: pa.Table, fmt: str) -> Response:
    """`table` as JSON records, CSV or Parquet, streamed batch by batch (JSON and CSV) while at most two
    downloads are built at once; a third waits up to DOWNLOAD_WAIT_S, then is a 503."""
    if not DOWNLOADS.acquire(timeout=DOWNLOAD_WAIT_S):
        raise ApiError(503, "Busy", "two downloads are being built; try again in a moment, or select one sweep")
    slot = _Slot()
    try:
        if fmt == "parquet":
            buf = pa.BufferOutputStream()
            pq.write_table(table, buf, compression="zstd")
            slot.release()
            return Response(buf.getvalue().to_pybytes(), media_type="application/vnd.apache.parquet")
        return _SlotResponse(_chunks(table, fmt), "text/csv" if fmt == "csv" else "application/json", slot)
    except BaseException:
        slot.release()
        raise


def _chunks(table: pa.Table, fmt: str) -> Iterator[str]:
    """The response's text a batch at a time (one CSV header; JSON records joined into one array)."""
    yield "" if fmt == "csv" else "["
    wrote = False
    for batch in table.to_batches(max_chunksize=DOWNLOAD_BATCH):
        frame = batch.to_pandas()
        if fmt == "csv":
            text = to_csv(frame)
            yield text.split("\n", 1)[1] if wrote else text
        elif len(frame):
            yield ("," if wrote else "") + frame.to_json(orient="records", date_format="iso")[1:-1]
        wrote = wrote or len(frame) > 0
    if fmt == "csv" and not wrote:
        yield to_csv(table.slice(0, 0).to_pandas())
    yield "" if fmt == "csv" else "]"

"""The HTTP API over the same core as the CLI. Errors become one JSON shape here, at the edge:

{"error": {"type": "SpecError", "message": "...", "field": "bucket_cap_mb[0]"}}
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Annotated, Literal

import pandas as pd
import pyarrow.compute as pc
from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from results.analysis import compare as compare_mod
from results.analysis import history as history_mod
from results.analysis import recommend as recommend_mod
from results.analysis.cells import computed_once
from results.errors import StoreNotFound
from results.model import predicted
from results.render.report import render_html
from results.sql import query as query_mod
from results.sql.formats import to_csv
from results.sql.views import VIEWS
from results.storage.cache import ANALYSIS_MAX_ROWS, DOWNLOAD_MAX_ROWS, STORE_MAX_ROWS, CachedStore
from results.storage.store import require_label
from service import dashboard, jobs
from service.clusterstate import ClusterState
from service.downloads import download
from service.errors import ApiError
from service.submission import JOB_CALLS, cluster_address, job_server_call, submit_spec
from trainers.errors import DDPSweepError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024
BODY_TIMEOUT_S = 30.0  # a request's whole body, once its headers arrived (service.httpserver times the headers)


@dataclass(frozen=True)
class ServiceSettings:
    address: str | None  # Ray dashboard / job server
    results: str  # results root
    token: str | None  # bearer token for mutating endpoints and /query
    max_body_bytes: int = MAX_BODY_BYTES
    public_reads: bool = True  # reads without a token; `serve` sets False when it binds beyond loopback
    allowed_hosts: tuple[str, ...] | None = None  # Host header values accepted (None: any; `serve` sets them)
    allow_workload: tuple[str, ...] = ()  # module prefixes a submitted spec's `workload` may come from
    allow_env: tuple[str, ...] = ()  # variables a submitted spec may set beyond sweeps.spec.envvars.TUNING
    workload_dir: str | None = None  # the folder shipped with a sweep naming an allowed workload (never the cwd)
    max_rows: int = STORE_MAX_ROWS  # rows the server keeps in memory; more is a 413 naming --max-rows
    body_timeout_s: float = BODY_TIMEOUT_S  # a request body not received within this is a 408


def _error_response(status: int, type_: str, message: str, field: str | None = None) -> JSONResponse:
    body = {"error": {"type": type_, "message": message} | ({"field": field} if field else {})}
    # 408: the rest of the body may still arrive, so the connection cannot carry another request
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {"Connection": "close"} if status == 408 else None
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI, settings: ServiceSettings) -> None:
    async def known_error(_: Request, exc: Exception):
        root = os.path.abspath(os.path.expanduser(settings.results))
        message = query_mod.scrub(getattr(exc, "message", None) or str(exc), settings.results, root)
        return _error_response(
            exc.http_status, getattr(exc, "type", type(exc).__name__), message, getattr(exc, "field", None)
        )

    app.add_exception_handler(DDPSweepError, known_error)  # every error of the one tree carries its http_status

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        return _error_response(exc.status_code, "HTTPError", str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        return _error_response(422, "ValidationError", first.get("msg", "invalid request"), field or None)

    @app.middleware("http")
    async def unexpected_error(request: Request, call_next):
        # A handler for `Exception` would run in Starlette's ServerErrorMiddleware, which answers and then
        # re-raises, so the server drops the keep-alive connection and the client's next request on it.
        # Caught here, a bug is one 500 response and the connection stays usable.
        try:
            return await call_next(request)
        except Exception:  # noqa: BLE001
            log.exception("unhandled error")
            return _error_response(500, "InternalError", "internal error (see the server log)")


def require_token(settings: ServiceSettings):
    async def check(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        expected = settings.token or ""
        if scheme.lower() != "bearer" or not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            raise ApiError(401, "Unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")

    return check


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request's body: at most `limit` bytes (413), all of it within `timeout_s` (408, connection closed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "PayloadTooLarge", f"request body over {limit} bytes")
    body = b""
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, "PayloadTooLarge", f"request body over {limit} bytes")
    except TimeoutError:
        raise ApiError(408, "RequestTimeout", f"request body not received within {timeout_s:g} s") from None
    return body


def _label(kind: str, value: str | None) -> str | None:
    return value if value is None else require_label(kind, value)


class QueryBody(BaseModel):
    sql: str = Field(description=f"one read-only SELECT over the views {', '.join(VIEWS)}")
    format: Literal["json", "csv"] = "json"


def _frame_response(df: pd.DataFrame, fmt: str) -> Response:
    if fmt == "csv":
        return PlainTextResponse(to_csv(df), media_type="text/csv")
    if fmt == "parquet":
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        return Response(buf.getvalue(), media_type="application/vnd.apache.parquet")
    return Response(df.to_json(orient="records", date_format="iso"), media_type="application/json")


def _cached_query(cache: CachedStore, sql: str) -> pd.DataFrame:
    """One query in a child process under results.sql.isolation's limits (memory, deadline, result bytes)."""
    query_mod.check_read_only(sql)  # refused before anything is computed
    if cache.table().num_rows == 0 and cache.calibration().empty:
        raise StoreNotFound(f"no results under {cache.root!r}: run a sweep first")
    return query_mod.query_in_child(
        *cache.ipc_files(), sql, timeout_s=query_mod.QUERY_TIMEOUT_S, max_rows=query_mod.MAX_RESULT_ROWS
    )


def create_app(settings: ServiceSettings) -> FastAPI:
    """The ddpsweep HTTP API (OpenAPI at /openapi.json, interactive docs at /docs)."""
    app = FastAPI(
        title="ddpsweep",
        version="0.1.0",
        description="Submit DDP sweeps to a Ray cluster and query their Parquet results.",
    )
    install_error_handlers(app, settings)
    if settings.allowed_hosts is not None:
        # A DNS-rebinding page reaches a loopback server under its own host name: only the names the server
        # was started for are served, so the token-free reads stay this machine's.
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts))
    auth = Depends(require_token(settings))
    # Reads (rows, fingerprints with host names and NCCL settings, logs, the pages) are open on loopback only:
    # bound beyond it, every endpoint but the API docs asks for the token.
    read_auth = [] if settings.public_reads else [auth]
    add_sweep_routes(app, settings, auth, read_auth)
    cache = CachedStore(settings.results, max_rows=settings.max_rows)
    add_result_routes(app, settings, cache, auth, read_auth)
    add_dashboard_routes(app, settings, cache, read_auth)
    return app


def add_sweep_routes(app: FastAPI, settings: ServiceSettings, auth, read_auth: list) -> None:
    gate = threading.BoundedSemaphore(JOB_CALLS)

    @app.post("/sweeps", status_code=201, dependencies=[auth], summary="Submit a sweep (spec as YAML or JSON)")
    async def submit_sweep(request: Request, cluster: str | None = None, results: str | None = None) -> dict:
        if results is not None and results != settings.results:  # the server's root is the only one it writes to
            raise ApiError(
                422,
                "ValidationError",
                "results: this server writes only to its own --results root; leave the parameter out",
                "results",
            )
        text = (await read_body(request, settings.max_body_bytes, settings.body_timeout_s)).decode(
            "utf-8", errors="replace"
        )
        # parsing, the checks and the submission block (a slow cluster for seconds): off the event loop
        with job_server_call(gate):
            return await run_in_threadpool(submit_spec, settings, text, _label("cluster", cluster))

    @app.get(
        "/sweeps",
        dependencies=read_auth,
        summary="Every sweep the cluster knows: job state, cells written / planned, errors",
    )
    def list_sweeps() -> list[dict]:
        with job_server_call(gate):
            return [s.to_dict() for s in jobs.status(cluster_address(settings, "list sweeps"))]

    @app.get("/sweeps/{sweep_id}", dependencies=read_auth, summary="One sweep's state")
    def get_sweep(sweep_id: str) -> dict:
        with job_server_call(gate):
            return jobs.status(cluster_address(settings, "follow sweeps"), _label("sweep_id", sweep_id))[0].to_dict()

    @app.get(
        "/sweeps/{sweep_id}/logs",
        response_class=PlainTextResponse,
        dependencies=read_auth,
        summary="The sweep job's output",
    )
    def sweep_logs(sweep_id: str) -> str:
        with job_server_call(gate):
            return jobs.logs(cluster_address(settings, "follow sweeps"), _label("sweep_id", sweep_id))

    @app.delete("/sweeps/{sweep_id}", dependencies=[auth], summary="Stop a sweep (written rows stay)")
    def stop_sweep(sweep_id: str) -> dict:
        with job_server_call(gate):
            stopped = jobs.stop(cluster_address(settings, "stop sweeps"), _label("sweep_id", sweep_id))
        return {"sweep_id": sweep_id, "stopped": stopped}


def add_result_routes(app: FastAPI, settings: ServiceSettings, cache: CachedStore, auth, read_auth: list) -> None:
    @app.get("/cells", dependencies=read_auth, summary="Result rows, filtered; json, csv or parquet")
    def cells(
        cluster: str | None = None,
        sweep: str | None = None,
        model: str | None = None,
        world_size: int | None = None,
        gas: int | None = None,
        no_sync: bool | None = None,
        status: Literal["ok", "error"] | None = None,
        format: Literal["json", "csv", "parquet"] = "json",
    ) -> Response:
        table = cache.selected(_label("cluster", cluster), _label("sweep", sweep), limit=DOWNLOAD_MAX_ROWS)
        for col, value in {
            "model": model,
            "world_size": world_size,
            "gas": gas,
            "no_sync": no_sync,
            "status": status,
        }.items():
            if value is not None:
                table = table.filter(pc.equal(table[col], value))
        return download(table, format)

    @app.post("/query", dependencies=[auth], summary="Read-only SQL (the sandbox of `ddpsweep query`)")
    async def run_query(request: Request) -> Response:
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        try:
            body = QueryBody.model_validate(json.loads(raw or b"{}"))
        except (ValueError, json.JSONDecodeError, RecursionError) as e:
            message = f"body must be {{'sql': …, 'format': 'json'|'csv'}}: {str(e)[:200] or 'nested too deep'}"
            raise ApiError(422, "ValidationError", message, "sql") from None
        # DuckDB runs in the thread pool, never on the event loop: one slow query holds no other request.
        frame = await run_in_threadpool(_cached_query, cache, body.sql)
        return _frame_response(frame, body.format)

    @app.get("/compare", dependencies=read_auth, summary="Two clusters side by side")
    def compare(cluster: Annotated[list[str], Query()], sweep: Annotated[list[str] | None, Query()] = None) -> Response:
        if len(cluster) != 2 or cluster[0] == cluster[1]:
            raise ApiError(422, "ValidationError", "give exactly two different: ?cluster=A&cluster=B", "cluster")
        sides = [cache.rows(_label("cluster", c), limit=ANALYSIS_MAX_ROWS) for c in cluster]
        rows = pd.concat(sides, ignore_index=True)
        if sweep:
            rows = rows[rows["sweep_id"].isin(sweep)]
        return _frame_response(compare_mod.compare(rows, cluster[0], cluster[1]), "json")

    @app.get("/history", dependencies=read_auth, summary="One cluster over time: changes beyond the noise")
    def cluster_history(cluster: str) -> Response:
        rows = cache.rows(_label("cluster", cluster), limit=ANALYSIS_MAX_ROWS)
        return _frame_response(history_mod.history(rows, cluster), "json")

    @app.get("/recommend", dependencies=read_auth, summary="Best DDP configuration per curve, with code to paste")
    def recommend(cluster: str | None = None, sweep: str | None = None) -> Response:
        def answer() -> str:
            rows = cache.rows(_label("cluster", cluster), _label("sweep", sweep), limit=ANALYSIS_MAX_ROWS)
            return recommend_mod.to_json(recommend_mod.recommend(rows))

        return Response(cache.memo(("recommend", cluster, sweep), answer), media_type="application/json")

    @app.get("/report", response_class=HTMLResponse, dependencies=read_auth, summary="The self-contained HTML report")
    def report(cluster: str | None = None, sweep: str | None = None) -> str:
        def render() -> str:
            rows = cache.rows(_label("cluster", cluster), _label("sweep", sweep), limit=ANALYSIS_MAX_ROWS)
            calibration = cache.calibration(cluster, sweep)
            title = f"ddpsweep report: {cluster or 'all clusters'}{' / ' + sweep if sweep else ''}"
            with computed_once():  # the prediction and every section read one computation of the cells
                model = predicted.for_rows(rows, cache.profiles().to_pandas(), cache.calibration(cluster))
                return render_html(rows, title, calibration=calibration, prediction=model)

        return cache.memo(("report", cluster, sweep), render)  # once per version of the store


def add_dashboard_routes(app: FastAPI, settings: ServiceSettings, cache: CachedStore, read_auth: list) -> None:
    """The dashboard's pages (service.dashboard); reads follow the API's rule. The sweeps table's job states come
    from one background poller (service.clusterstate): no request waits on the cluster."""
    state = ClusterState(settings.address) if settings.address else None

    @app.get("/", response_class=HTMLResponse, dependencies=read_auth, summary="Dashboard: every sweep")
    def index() -> str:
        return dashboard.sweeps_page()

    @app.get("/ui/sweeps.json", dependencies=read_auth, summary="The sweeps table of the dashboard")
    def sweeps_json() -> Response:
        return Response(dashboard.sweeps_json(cache, state), media_type="application/json")

    @app.get(
        "/ui/sweep/{cluster}/{sweep}",
        response_class=HTMLResponse,
        dependencies=read_auth,
        summary="Dashboard: one sweep",
    )
    def sweep_page(cluster: str, sweep: str) -> str:
        key = ("sweep_page", _label("cluster", cluster), _label("sweep", sweep))
        return cache.memo(key, lambda: dashboard.sweep_page(cache, key[1], key[2]))

    @app.get("/ui/history", response_class=HTMLResponse, dependencies=read_auth, summary="Dashboard: a history")
    def history_page(cluster: str | None = None) -> str:
        return dashboard.history_page(cache, _label("cluster", cluster))

    @app.get(
        "/ui/compare",
        response_class=HTMLResponse,
        dependencies=read_auth,
        summary="Dashboard: two clusters or two sweeps",
    )
    def compare_page(a: str | None = None, b: str | None = None, by: Literal["cluster", "sweep"] = "cluster") -> str:
        if a is not None and a == b:
            raise ApiError(422, "ValidationError", f"b: {b!r} is a too; compare two different {by}s", "b")
        return dashboard.compare_page(cache, _label("a", a), _label("b", b), by)

"""The web app behind the Airflow UI's slotlake view (`ui_plugin.SlotlakePlugin` mounts it at /slotlake).

    GET /slotlake/             the page: per source the slot, the gold tables, the last runs and a chart
    GET /slotlake/api/status   the same as JSON

Both read `$SLOTLAKE_CONFIG` per request (as the DAG file does) and answer only users the Airflow API server
authenticates (its `_token` cookie, which the UI's iframe sends, or a Bearer token) with access to the Airflow
website. Reads need no JVM: the slot from PostgreSQL, the lake's Delta logs and `_runs` with delta-rs
(`slotlake.status`). A part that cannot be read (a database down, a lake not reachable) becomes an error line of
its source; a part that does not answer within READ_TIMEOUT_S is reported as such and the page renders anyway.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse

from slotlake.config import Config, load_config
from slotlake.status import gold_table_status, run_rows, slot_state
from slotlake.status_view import SourceView, render_page, source_view, view_json

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 15.0  # for all reads of one request (sources are read in parallel)
LAST_RUNS = 20

# Who may see the view: a user the API server authenticates, allowed to use the Airflow website (every UI role).
access_check = requires_access_view(AccessView.WEBSITE)


def collect(cfg: Config, *, timeout_s: float = READ_TIMEOUT_S, last_runs: int = LAST_RUNS) -> list[SourceView]:
    """Every configured source's view; the parts (slot, gold tables, runs) of all sources are read in parallel."""
    from slotlake.lake import LakePaths

    parts: dict[str, Callable[[str], Any]] = {
        "slot": functools.partial(slot_state, cfg),
        "tables": functools.partial(gold_table_status, cfg, spark=False),  # never a JVM in the API server
        "runs": functools.partial(run_rows, cfg, last_runs=last_runs),
    }
    pool = ThreadPoolExecutor(max_workers=min(8, 3 * len(cfg.sources)) or 1, thread_name_prefix="slotlake-view")
    try:
        futures = {(name, part): pool.submit(read, name) for name in cfg.sources for part, read in parts.items()}
        wait(futures.values(), timeout=timeout_s)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung connect must not hold the page
    views = []
    for name in cfg.sources:
        got: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for part in parts:
            fut = futures[(name, part)]
            if not fut.done():
                errors[part] = f"no answer within {timeout_s:.0f} s"
            elif fut.exception() is not None:
                errors[part] = _one_line(fut.exception())
            else:
                got[part] = fut.result()
        views.append(source_view(name, LakePaths.of(cfg.lake, name).root, slot=got.get("slot"),
                                 tables=got.get("tables") or [], run_rows=got.get("runs") or [],
                                 warn_retained_wal_mb=cfg.extract.warn_retained_wal_mb, errors=errors))
    return views


def _one_line(err: BaseException | None) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 500 else text[:500] + " ..."


def _status() -> tuple[list[SourceView], datetime, str | None]:
    now = datetime.now(UTC)
    try:
        cfg = load_config()
    except Exception as e:  # no $SLOTLAKE_CONFIG in the API server's environment, or a bad file
        return [], now, (f"the slotlake config cannot be loaded: {_one_line(e)}; set SLOTLAKE_CONFIG in the "
                         "environment of the Airflow API server to the config the DAGs use")
    return collect(cfg), now, None


def create_app() -> FastAPI:
    """The FastAPI app (no OpenAPI docs: its two routes are the page and its JSON)."""
    app = FastAPI(title="slotlake", docs_url=None, redoc_url=None, openapi_url=None)
    guard = [Depends(access_check)]

    @app.get("/", response_class=HTMLResponse, dependencies=guard)
    def page() -> HTMLResponse:
        views, now, error = _status()
        return HTMLResponse(render_page(views, now, error=error))

    @app.get("/api/status", dependencies=guard)
    def status() -> dict[str, Any]:
        views, now, error = _status()
        return view_json(views, now, error=error)

    return app


@functools.cache
def status_app() -> FastAPI:
    """The one app the plugin mounts (built on first use: importing the plugin stays cheap)."""
    return create_app()

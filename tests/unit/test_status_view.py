"""slotlake.status_view: the Airflow UI's slotlake view as pure functions (alerts, runs, chart, page)."""
from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

import pytest

from slotlake.status_view import (
    ERROR,
    WARNING,
    chart_svg,
    render_page,
    slot_alerts,
    source_view,
    summarize_runs,
    view_json,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
MB = 1024 * 1024


def slot(**changes) -> dict:
    base = {"slot": "slotlake_shop", "exists": True, "active": False, "wal_status": "reserved", "invalidated": None,
            "restart_lsn": "0/1000", "confirmed_flush_lsn": "0/2000", "current_lsn": "0/3000", "lag_bytes": 4096,
            "retained_wal_bytes": 8192, "server_version": 170000, "inactive_since": None,
            "idle_replication_slot_timeout_s": None}
    return {**base, **changes}


def run_row(end: str, table: str, *, started: float | None, finished: float, changes: int | None,
            last_commit: float | None) -> dict:
    def at(seconds: float | None) -> datetime | None:
        return None if seconds is None else T0 + timedelta(seconds=seconds)

    return {"run_end_lsn": end, "schema_name": "public", "table_name": table, "gold_version": 1,
            "finished_at": at(finished), "started_at": at(started), "changes": changes,
            "last_commit_ts": at(last_commit)}


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, []),
    ({"exists": False, "wal_status": None, "lag_bytes": None, "retained_wal_bytes": None},
     [(ERROR, "slot slotlake_shop does not exist")]),
    ({"invalidated": "wal_removed", "wal_status": "lost"},
     [(ERROR, "slot slotlake_shop was invalidated (wal_removed)")]),
    ({"wal_status": "lost"}, [(ERROR, "wal_status lost")]),
    ({"wal_status": "unreserved"}, [(ERROR, "wal_status unreserved")]),
    ({"wal_status": "extended"}, []),
    ({"retained_wal_bytes": 2 * MB + 1}, [(WARNING, "retains 2.0 MB of WAL")]),
    ({"retained_wal_bytes": 2 * MB}, []),  # at the threshold: preflight does not warn either
    ({"wal_status": "unreserved", "retained_wal_bytes": 3 * MB},
     [(ERROR, "wal_status unreserved"), (WARNING, "retains 3.0 MB")]),
], ids=["healthy", "missing", "invalidated", "lost", "unreserved", "extended", "retained-over", "retained-at",
        "unreserved-and-retained"])
def test_slot_alerts(changes, expected):
    alerts = slot_alerts("shop", slot(**changes), warn_retained_wal_bytes=2 * MB)
    assert [a.level for a in alerts] == [level for level, _ in expected]
    for alert, (_, text) in zip(alerts, expected):
        assert text in alert.text
    assert all("resync shop" in a.text for a in alerts if "lost" in a.text or "invalidated" in a.text)


def test_runs_are_grouped_by_end_lsn_newest_first():
    rows = [
        run_row("0/200", "orders", started=100, finished=130, changes=40, last_commit=90),
        run_row("0/200", "customers", started=105, finished=130, changes=20, last_commit=95),
        run_row("0/100", "orders", started=0, finished=10, changes=5, last_commit=2),
        run_row("0/100", "customers", started=1, finished=10, changes=0, last_commit=None),
    ]
    newest, oldest = summarize_runs(rows)
    assert (newest.run_end_lsn, newest.tables, newest.changes) == ("0/200", 2, 60)
    assert newest.started_at == T0 + timedelta(seconds=100) and newest.finished_at == T0 + timedelta(seconds=130)
    assert newest.duration_s == 30 and newest.throughput == 2.0
    assert newest.lag_s == 35  # finished 130 - newest commit 95
    assert (oldest.changes, oldest.duration_s, oldest.throughput, oldest.lag_s) == (5, 10, 0.5, 8)


def test_rows_of_an_older_runs_table_have_no_duration_or_lag():
    rows = [run_row("0/100", "orders", started=None, finished=10, changes=None, last_commit=None),
            run_row("0/100", "items", started=3, finished=10, changes=4, last_commit=None)]
    (run,) = summarize_runs(rows)
    assert run.changes is None  # one table's count is unknown: the sum would be wrong
    assert run.duration_s == 7 and run.throughput is None and run.lag_s is None
    (only_old,) = summarize_runs([run_row("0/100", "orders", started=None, finished=10, changes=None,
                                          last_commit=None)])
    assert (only_old.duration_s, only_old.throughput, only_old.lag_s) == (None, None, None)


def test_a_run_without_changes_has_no_throughput_division_by_zero():
    (run,) = summarize_runs([run_row("0/100", "orders", started=10, finished=10, changes=0, last_commit=None)])
    assert (run.duration_s, run.throughput, run.changes) == (0, None, 0)


def test_chart_is_one_svg_with_both_series_and_gaps():
    rows = [run_row(f"0/{i}00", "orders", started=i * 100, finished=i * 100 + 10, changes=10 * i,
                    last_commit=None if i == 2 else i * 100 + 5) for i in range(1, 5)]
    svg = chart_svg(summarize_runs(rows))
    root = ElementTree.fromstring(svg)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert len(root.findall(f"{ns}rect")) == 4  # throughput: every run
    assert len(root.findall(f"{ns}circle")) == 3  # lag: run 2 has none
    assert len(root.findall(f"{ns}polyline")) == 2  # the gap splits the line
    assert "script" not in svg and "http" not in svg.replace("http://www.w3.org/2000/svg", "")
    assert chart_svg([]) == ""


def test_page_escapes_everything_and_shows_alerts_errors_and_runs():
    evil = "<script>alert(1)</script>"
    view = source_view(
        "shop", f"/lake/{evil}", slot=slot(slot=evil, wal_status="unreserved"),
        tables=[{"table": f"public.{evil}", "applied_lsn": "0/200", "applied_by": "merge", "gold_version": 3,
                 "committed_at": "2026-11-25T10:02:10+00:00"}],
        run_rows=[run_row("0/200", evil, started=100, finished=130, changes=60, last_commit=95)],
        warn_retained_wal_mb=1024, errors={"runs": f"boom {evil}"})
    page = render_page([view], T0)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'class="banner error"' in page and "wal_status unreserved" in page
    assert "cannot read the merge runs (_runs)" in page
    assert "0/200" in page and "<svg" in page and "60" in page
    assert '<a href="api/status">' in page  # relative: works under the /slotlake mount and any URL prefix
    doc = json.loads(json.dumps(view_json([view], T0)))
    (src,) = doc["sources"]
    assert src["runs"][0]["changes"] == 60 and src["runs"][0]["lag_s"] == 35
    assert src["alerts"] == [{"level": "error", "text": view.alerts[0].text}]
    assert set(src["errors"]) == {"runs"}


def test_page_renders_a_source_whose_database_is_down_and_lake_is_empty():
    view = source_view("shop", "/lake/shop", slot=None, tables=[], run_rows=[], warn_retained_wal_mb=1024,
                       errors={"slot": "source shop: cannot connect to postgresql://u@h/db: refused"})
    page = render_page([view], T0)
    assert "cannot read the slot from the source database; check sources.shop.dsn" in page
    assert "no gold tables yet: run `slotlake sync shop`" in page
    assert "no merge run has finished yet" in page
    assert view_json([view], T0)["sources"][0]["slot"] is None


def test_config_error_is_the_page():
    page = render_page([], T0, error="the slotlake config cannot be loaded: <x>")
    assert re.search(r'class="banner error">the slotlake config cannot be loaded: &lt;x&gt;', page)
    assert view_json([], T0, error="e") == {"generated_at": T0.isoformat(), "sources": [], "error": "e"}

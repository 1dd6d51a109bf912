"""The slotlake view of the Airflow UI, as pure functions: a source's slot state, gold tables and `_runs` rows in,
a view model (alerts, per-run aggregates), its JSON, an SVG chart and the HTML page out.

Inputs are the plain values `slotlake.status` returns (the slot as `SlotStatus` fields, gold tables as
`gold_table_status` rows, `_runs` rows as `run_rows` gives them); the I/O and the web app are in
`slotlake.airflow.status_app`. Every text that reaches the page goes through `html.escape`.
"""
from __future__ import annotations

import html
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slotlake.lsn import Lsn

ERROR = "error"  # red: the slot lost (or is about to lose) WAL, or is gone
WARNING = "warning"  # amber: worth acting on soon

# What each part the page reads failed on means, and what to do (the error's own text follows).
_PART_HINTS = {
    "slot": "cannot read the slot from the source database; check sources.{source}.dsn (or its Airflow "
            "connection) and that PostgreSQL accepts connections from the Airflow API server",
    "tables": "cannot read the gold tables of lake {lake}; check `lake:` in the config and the API server's "
              "access to it",
    "runs": "cannot read the merge runs (_runs) of lake {lake}; check `lake:` in the config and the API server's "
            "access to it",
}


@dataclass(frozen=True)
class Alert:
    level: str  # ERROR | WARNING
    text: str


@dataclass(frozen=True)
class RunSummary:
    """One merge run (the `_runs` rows of one `run_end_lsn`). None: not known (rows of an older `_runs` table)."""

    run_end_lsn: str
    tables: int
    changes: int | None  # silver rows applied, summed over the tables
    started_at: datetime | None  # the earliest table merge start
    finished_at: datetime | None
    duration_s: float | None  # finished_at - started_at
    throughput: float | None  # changes per second of duration
    lag_s: float | None  # finished_at - commit time of the newest change applied (None: no change applied)

    def as_dict(self) -> dict[str, Any]:
        return {"run_end_lsn": self.run_end_lsn, "tables": self.tables, "changes": self.changes,
                "started_at": _iso(self.started_at), "finished_at": _iso(self.finished_at),
                "duration_s": self.duration_s, "throughput_per_s": self.throughput, "lag_s": self.lag_s}


@dataclass(frozen=True)
class SourceView:
    source: str
    lake: str
    slot: Mapping[str, Any] | None  # None: could not be read (see errors)
    tables: tuple[Mapping[str, Any], ...]
    runs: tuple[RunSummary, ...]  # newest first
    alerts: tuple[Alert, ...]
    errors: Mapping[str, str] = field(default_factory=dict)  # part that could not be read -> line saying what to do

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "lake": self.lake, "slot": dict(self.slot) if self.slot is not None else None,
                "tables": [dict(t) for t in self.tables], "runs": [r.as_dict() for r in self.runs],
                "alerts": [{"level": a.level, "text": a.text} for a in self.alerts], "errors": dict(self.errors)}


# ---- the view model ------------------------------------------------------------------------------------------

def slot_alerts(source: str, slot: Mapping[str, Any], warn_retained_wal_bytes: int) -> list[Alert]:
    """What about the slot should stand out: gone, invalidated / lost, about to lose WAL, keeping too much WAL."""
    name = slot.get("slot")
    if not slot.get("exists"):
        return [Alert(ERROR, f"slot {name} does not exist: a new source creates it on its first sync; if {source} "
                             f"was synced before, its changes since are lost: run `slotlake resync {source}`")]
    out = []
    if slot.get("invalidated"):
        out.append(Alert(ERROR, f"slot {name} was invalidated ({slot['invalidated']}): changes after its last "
                                f"archived position are lost; run `slotlake resync {source}`"))
    elif slot.get("wal_status") == "lost":
        out.append(Alert(ERROR, f"slot {name} has wal_status lost: WAL it needs was removed; run "
                                f"`slotlake resync {source}`"))
    elif slot.get("wal_status") == "unreserved":
        out.append(Alert(ERROR, f"slot {name} has wal_status unreserved: it is past max_slot_wal_keep_size and "
                                f"about to lose WAL it needs; run a sync of {source} now"))
    retained = slot.get("retained_wal_bytes")
    if retained is not None and retained > warn_retained_wal_bytes:
        out.append(Alert(WARNING, f"slot {name} retains {_bytes(retained)} of WAL on the source (more than "
                                  f"extract.warn_retained_wal_mb = {_bytes(warn_retained_wal_bytes)}); run syncs "
                                  "more often or check that the sync DAG is running"))
    return out


def summarize_runs(rows: Iterable[Mapping[str, Any]]) -> list[RunSummary]:
    """`_runs` rows grouped by run (`run_end_lsn`), newest first: changes summed, duration from the earliest
    table start to the run's finish, throughput = changes / duration, lag from the newest applied commit time."""
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(str(r["run_end_lsn"]), []).append(r)
    out = []
    for end, group in by_run.items():
        finished = _max(r.get("finished_at") for r in group)
        started = _min(r.get("started_at") for r in group)
        counts = [r.get("changes") for r in group]
        changes: int | None = None if None in counts else sum(int(c) for c in counts if c is not None)
        duration = (finished - started).total_seconds() if finished is not None and started is not None else None
        throughput = changes / duration if changes is not None and duration else None
        newest = _max(r.get("last_commit_ts") for r in group)
        lag = (finished - newest).total_seconds() if finished is not None and newest is not None else None
        out.append(RunSummary(end, len(group), changes, started, finished, duration, throughput, lag))
    return sorted(out, key=lambda s: (s.finished_at.timestamp() if s.finished_at is not None else float("-inf"),
                                      _lsn_key(s)), reverse=True)


def source_view(source: str, lake: str, *, slot: Mapping[str, Any] | None, tables: Sequence[Mapping[str, Any]],
                run_rows: Iterable[Mapping[str, Any]], warn_retained_wal_mb: int,
                errors: Mapping[str, str] | None = None) -> SourceView:
    """The view of one source. `errors`: part ("slot" | "tables" | "runs") -> the error that part failed with."""
    lines = {part: f"{_PART_HINTS.get(part, 'cannot be read').format(source=source, lake=lake)} ({err})"
             for part, err in (errors or {}).items()}
    alerts = slot_alerts(source, slot, warn_retained_wal_mb * 1024 * 1024) if slot is not None else []
    return SourceView(source, lake, slot, tuple(tables), tuple(summarize_runs(run_rows)), tuple(alerts), lines)


def view_json(views: Sequence[SourceView], generated_at: datetime, *, error: str | None = None) -> dict[str, Any]:
    """The JSON of the view; `error`: why there are no sources (the config could not be loaded)."""
    doc: dict[str, Any] = {"generated_at": generated_at.isoformat(), "sources": [v.as_dict() for v in views]}
    if error is not None:
        doc["error"] = error
    return doc


# ---- the chart -----------------------------------------------------------------------------------------------

def chart_svg(runs: Sequence[RunSummary], *, width: int = 640, height: int = 120) -> str:
    """Lag (s, a line) and throughput (changes/s, bars) of `runs` (newest first), oldest left: two panels of one
    inline SVG. Runs without a value leave a gap. No script, no external resource."""
    ordered = list(reversed(runs))
    if not ordered:
        return ""
    labels = [f"run to {r.run_end_lsn}, finished {_iso(r.finished_at) or '?'}" for r in ordered]
    panels = [_panel("lag (s)", [r.lag_s for r in ordered], labels, "line", width, height, 0),
              _panel("throughput (changes/s)", [r.throughput for r in ordered], labels, "bars", width, height,
                     height + 10)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{2 * height + 10}" '
            f'viewBox="0 0 {width} {2 * height + 10}" role="img" aria-label="lag and throughput of the last runs">'
            + "".join(panels) + "</svg>")


def _panel(title: str, values: Sequence[float | None], labels: Sequence[str], kind: str, width: int, height: int,
           top: int) -> str:
    left, right, pad_top, pad_bottom = 48, 8, 18, 6
    plot_w, plot_h = width - left - right, height - pad_top - pad_bottom
    known = [v for v in values if v is not None]
    peak = max(known, default=0.0) or 1.0
    step = plot_w / max(len(values), 1)

    def y(v: float) -> float:
        return top + pad_top + plot_h * (1 - max(v, 0.0) / peak)

    parts = [f'<text x="{left}" y="{top + 12}" class="title">{_e(title)}</text>',
             f'<text x="{left - 4}" y="{top + pad_top + 8}" class="axis" text-anchor="end">{_e(_num(peak))}</text>',
             f'<text x="{left - 4}" y="{top + pad_top + plot_h}" class="axis" text-anchor="end">0</text>',
             f'<line x1="{left}" y1="{top + pad_top + plot_h}" x2="{left + plot_w}" y2="{top + pad_top + plot_h}" '
             'class="base"/>']
    if not known:
        parts.append(f'<text x="{left + 8}" y="{top + pad_top + plot_h / 2}" class="axis">no data</text>')
    points: list[tuple[float, float]] = []
    for i, (v, label) in enumerate(zip(values, labels)):
        if v is None:
            if points:
                parts.append(_polyline(points))
                points = []
            continue
        cx = left + step * (i + 0.5)
        tip = f"<title>{_e(label)}: {_e(_num(v))}</title>"
        if kind == "bars":
            bw = max(step * 0.7, 1.0)
            parts.append(f'<rect x="{cx - bw / 2:.1f}" y="{y(v):.1f}" width="{bw:.1f}" '
                         f'height="{top + pad_top + plot_h - y(v):.1f}" class="bar">{tip}</rect>')
        else:
            points.append((cx, y(v)))
            parts.append(f'<circle cx="{cx:.1f}" cy="{y(v):.1f}" r="3" class="dot">{tip}</circle>')
    if points:
        parts.append(_polyline(points))
    return "".join(parts)


def _polyline(points: Sequence[tuple[float, float]]) -> str:
    return '<polyline points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '" class="line"/>'


# ---- the page ------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 16px; color: #1a202c; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; } h3 { font-size: 14px; margin: 14px 0 6px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #cbd5e0; padding: 3px 8px; }
th { background: #edf2f7; text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.banner { padding: 8px 12px; margin: 6px 0; border-radius: 4px; font-size: 14px; }
.error { background: #fed7d7; border: 1px solid #c53030; color: #742a2a; }
.warning { background: #feebc8; border: 1px solid #c05621; color: #7b341e; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; margin-left: 8px; }
.badge.ok { background: #c6f6d5; color: #22543d; }
.note { color: #4a5568; font-size: 13px; }
svg.chart .title { font-size: 12px; fill: #2d3748; } svg.chart .axis { font-size: 10px; fill: #718096; }
svg.chart .base { stroke: #a0aec0; } svg.chart .line { fill: none; stroke: #2b6cb0; stroke-width: 2; }
svg.chart .dot { fill: #2b6cb0; } svg.chart .bar { fill: #38a169; }
"""


def render_page(views: Sequence[SourceView], generated_at: datetime, *, error: str | None = None) -> str:
    """The whole HTML page (no script; the links are relative to the page, so it works behind a URL prefix).
    `error`: why there are no sources (the config could not be loaded)."""
    banners = [f'<div class="banner error">{_e(error)}</div>'] if error is not None else []
    banners += [f'<div class="banner {a.level}">{_e(v.source)}: {_e(a.text)}</div>' for v in views for a in v.alerts]
    banners += [f'<div class="banner error">{_e(v.source)}: {_e(e)}</div>' for v in views for e in v.errors.values()]
    body = "".join(_source_html(v) for v in views)
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>slotlake</title>"
            f"<style>{_CSS}</style></head><body><h1>slotlake</h1>"
            f'<p class="note">as of {_e(generated_at.isoformat(timespec="seconds"))} · '
            '<a href="api/status">JSON</a></p>' + "".join(banners) + body + "</body></html>")


def _source_html(v: SourceView) -> str:
    worst = ERROR if v.errors or any(a.level == ERROR for a in v.alerts) else (WARNING if v.alerts else None)
    badge = (f'<span class="badge {worst}">{len(v.alerts) + len(v.errors)} to check</span>' if worst
             else '<span class="badge ok">ok</span>')
    out = [f"<h2>{_e(v.source)}{badge}</h2>", f'<p class="note">lake {_e(v.lake)}</p>']
    out += [f'<div class="banner {a.level}">{_e(a.text)}</div>' for a in v.alerts]
    out += [f'<div class="banner error">{_e(e)}</div>' for e in v.errors.values()]
    if v.slot is not None:
        s = v.slot
        out.append("<h3>slot</h3>" + _table(
            ["slot", "active", "wal_status", "invalidated", "lag", "retained WAL", "confirmed flush", "restart",
             "current WAL"],
            [[s.get("slot"), _yes(s.get("active")) if s.get("exists") else "missing", s.get("wal_status"),
              s.get("invalidated"), _bytes(s.get("lag_bytes")), _bytes(s.get("retained_wal_bytes")),
              s.get("confirmed_flush_lsn"), s.get("restart_lsn"), s.get("current_lsn")]], numeric={4, 5}))
    out.append("<h3>gold tables</h3>")
    if v.tables:
        out.append(_table(["table", "applied LSN", "by", "Delta version", "last commit"],
                          [[t.get("table"), t.get("applied_lsn"), t.get("applied_by"), t.get("gold_version"),
                            t.get("committed_at")] for t in v.tables], numeric={3}))
    elif "tables" not in v.errors:
        out.append(f'<p class="note">no gold tables yet: run `slotlake sync {_e(v.source)}` or the DAG '
                   f"slotlake_sync__{_e(v.source)}</p>")
    out.append("<h3>last runs</h3>")
    if v.runs:
        out.append(chart_svg(v.runs))
        out.append(_table(["finished", "run end LSN", "tables", "changes", "duration", "changes/s", "lag"],
                          [[_iso(r.finished_at), r.run_end_lsn, r.tables, r.changes, _secs(r.duration_s),
                            _num(r.throughput) if r.throughput is not None else None, _secs(r.lag_s)]
                           for r in v.runs], numeric={2, 3, 4, 5, 6}))
    else:
        out.append('<p class="note">no merge run has finished yet</p>')
    return "".join(out)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Collection[int] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{_e(_cell(c))}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


# ---- formatting ----------------------------------------------------------------------------------------------

def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _cell(value: Any) -> str:
    return "–" if value is None or value == "" else str(value)


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def _bytes(n: int | None) -> str | None:
    if n is None:
        return None
    if abs(n) < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("kB", "MB", "GB"):
        if abs(size) < 1024 or unit == "GB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"


def _secs(s: float | None) -> str | None:
    if s is None:
        return None
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _num(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}".rstrip("0").rstrip(".") or "0"


def _max(values: Iterable[Any]) -> Any:
    return max((v for v in values if v is not None), default=None)


def _min(values: Iterable[Any]) -> Any:
    return min((v for v in values if v is not None), default=None)


def _lsn_key(run: RunSummary) -> int:
    try:
        return int(Lsn.parse(run.run_end_lsn))
    except ValueError:
        return -1

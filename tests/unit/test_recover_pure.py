"""The recover request's pure parts: argument checks, the password kept out of arguments, the catalog version at a
point, the CREATE TABLE of a historical definition."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slotlake.catalog import CatalogColumn, CatalogVersion
from slotlake.errors import ConfigError
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.recover.point import RecoveredTable, RecoverResult, request, split_password, version_at
from slotlake.recover.to_postgres import create_table, custom_type_sql, key_clause

pytestmark = pytest.mark.unit


def test_delta_request_and_its_app_arguments():
    req, password = request("shop", "2024-03-01T09:14:00", ["public.orders", "Public.Orders", "b.c"], " /tmp/r ")
    assert password is None and req.target == "delta"
    assert req.as_of == datetime(2024, 3, 1, 9, 14, tzinfo=UTC)  # no zone: UTC
    assert req.tables == (TableName("public", "orders"), TableName("b", "c"))  # unquoted names fold; no repeats
    assert req.args() == ["--as-of", "2024-03-01T09:14:00+00:00", "--tables", "public.orders,b.c",
                          "--to-delta", "/tmp/r"]
    assert request("shop", "16/B374D848", ["a.b"], "s3a://x/y", replace=True)[0].args()[-1] == "--replace"


def test_postgres_request_takes_the_password_out_of_the_arguments():
    req, password = request("shop", "0/16", ["public.orders"], "postgresql://ann:p%40ss@db.example:5433/shop?sslmode=require")
    assert password == "p@ss" and req.target == "postgres" and req.into_schema == "recovered"
    args = " ".join(req.args())
    assert "p@ss" not in args and "p%40ss" not in args
    assert "host=db.example" in args and "port=5433" in args and "sslmode=require" in args and "user=ann" in args
    assert req.postgres_table(TableName("public", "orders")) == TableName("recovered", "orders")
    assert split_password("postgresql://ann@h/db")[1] is None


@pytest.mark.parametrize("args, message", [
    (("yesterday", ["a.b"], "/tmp/x"), "--as-of 'yesterday' is neither an LSN"),
    (("0/1", [], "/tmp/x"), "recover needs at least one --table"),
    (("0/1", ["a.b"], ""), "--to is required"),
    (("0/1", ["a.b"], "/tmp/x", "s"), "--into-schema applies only to a postgresql:// --to"),
    (("0/1", ["a.t", "b.t"], "postgresql://u@h/d"), "a.t and b.t would both become recovered.t"),
    (("0/1", ["a.b"], "postgresql://u:pw@h/d?x=[bad"), "--to is not a valid PostgreSQL URL"),
], ids=["bad-point", "no-table", "no-dest", "schema-for-delta", "same-name", "bad-url"])
def test_bad_arguments_are_refused_with_the_fix(args, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace(".", r"\.")) as e:
        request("shop", *args)
    assert "pw" not in str(e.value)


def _col(pos: int, name: str, oid: int = 23, typmod: int = -1, key: bool = False) -> CatalogColumn:
    return CatalogColumn(position=pos, name=name, type_oid=oid, type_name=None, typmod=typmod, nullable=None,
                         is_key=key)


def _version(n: int, frm: int, to: int | None, cols, identity: str = "d", name: str = "t") -> CatalogVersion:
    return CatalogVersion(rel_oid=1, schema_name="s", table_name=name, version=n, valid_from_lsn=frm,
                          valid_to_lsn=to, replica_identity=identity, columns=tuple(cols), origin="relation")


def test_version_at_a_point():
    v1 = _version(1, 100, 200, [_col(1, "id", key=True)])
    v2 = _version(2, 200, 300, [_col(1, "id", key=True), _col(2, "x")])
    versions = [v2, v1, _version(1, 50, None, [_col(1, "z")], name="other")]
    t = TableName("s", "t")
    assert version_at(versions, t, Lsn(150)) == v1 and version_at(versions, t, Lsn(200)) == v2
    assert version_at(versions, t, Lsn(10)) == v1  # before the first version: the bootstrap's (the copy's)
    assert version_at(versions, t, Lsn(300)) is None  # dropped by then
    assert version_at(versions, TableName("s", "nope"), Lsn(150)) is None


def test_create_table_with_key_by_replica_identity():
    cols = [_col(1, "Id", key=True), _col(2, "b", key=True), _col(3, "v")]
    types = [("Id", "integer"), ("b", "character varying(10)"), ("v", "numeric(12,2)")]
    into = TableName("recovered", "My T")
    assert create_table(into, types, key_clause(_version(1, 0, None, cols))).as_string(None) == (
        'CREATE TABLE "recovered"."My T" ("Id" integer, "b" character varying(10), "v" numeric(12,2), '
        'PRIMARY KEY ("Id", "b"))')
    assert key_clause(_version(1, 0, None, cols, identity="i")).as_string(None) == 'UNIQUE ("Id", "b")'
    assert key_clause(_version(1, 0, None, [_col(1, "a"), _col(2, "b")], identity="f")) is None
    assert key_clause(_version(1, 0, None, [_col(1, "a")], identity="d")) is None  # DEFAULT without a PK
    assert custom_type_sql("public.order_status") == '"public"."order_status"'


def test_result_round_trips_through_json_form():
    r = RecoverResult(source="shop", as_of="0/10", lsn=Lsn(16), commit_ts=datetime(2024, 1, 1, tzinfo=UTC),
                      target="delta", tables=(RecoveredTable("public.a", 3, "/x/public/a"),))
    assert RecoverResult.from_dict(r.as_dict()) == r
    assert r.lines() == ["recover shop as of 0/10: commit LSN 0/10, commit time 2024-01-01T00:00:00+00:00",
                         "  public.a: 3 rows -> /x/public/a"]



def test_result_says_which_tables_came_from_history():
    r = RecoverResult(source="shop", as_of="0/10", lsn=Lsn(16), commit_ts=None, target="delta",
                      tables=(RecoveredTable("public.a", 3, "/x/public/a"),
                              RecoveredTable("public.b", 1, "/x/public/b")),
                      from_history=("public.a",))
    assert RecoverResult.from_dict(r.as_dict()) == r and r.as_dict()["from_history"] == ["public.a"]
    assert r.lines()[1:] == ["  public.a: 3 rows -> /x/public/a (from history)", "  public.b: 1 rows -> /x/public/b"]


@pytest.mark.parametrize("lsn, covered", [(Lsn(9), False), (Lsn(10), True), (Lsn(15), True), (Lsn(20), True),
                                          (Lsn(21), False)], ids=["before", "start", "inside", "watermark", "past"])
def test_history_covers_from_its_start_to_its_watermark(lsn, covered):
    from slotlake.merge.history_job import HistoryCoverage

    assert HistoryCoverage(Lsn(10), Lsn(20)).covers(lsn) is covered

@pytest.mark.parametrize("text, ok", [
    ("16/B374D848", True), ("0/0", True), ("2024-03-01", True), ("2024-03-01T09:14", True),
    ("2024-03-01 09:14:00.123456", True), ("2024-03-01T09:14:00Z", True), ("2024-03-01T09:14:00+02:00", True),
    ("yesterday", False), ("16-B374D848", False), ("", False), ("2024-03-01T09", True), ("2024-03-01T", False),
    ("2024-13-01", False), ("2024-03-32", False), ("2024-03-01T25:00", False), ("2024-03-01T09:60", False),
    ("2024-03-01T23:59:59", True), ("2024-12-31T00:00+05:30", True),
], ids=lambda v: str(v))
def test_the_dag_form_pattern_accepts_exactly_what_the_cli_parses(text, ok):
    import re

    from slotlake.recover.point import AS_OF_PATTERN
    from slotlake.recover.replay import parse_point

    assert bool(re.match(AS_OF_PATTERN, text)) is ok
    if ok:
        parse_point(text, "--as-of")
    else:
        with pytest.raises(ConfigError):
            parse_point(text, "--as-of")


@pytest.mark.parametrize("params, message", [
    ({"mode": "undo_sql", "destination": "/tmp/u.sql"}, "mode undo_sql needs xid"),
    ({"mode": "undo_sql", "xid": 5, "destination": "postgresql://u@h/d"}, "mode undo_sql writes the SQL to a file"),
    ({"target": "postgres", "destination": "/tmp/x"}, "target postgres needs a postgresql:// URL as destination"),
    ({"target": "delta", "destination": "postgresql://u@h/d"}, "target delta needs a folder or URI as destination"),
], ids=["undo_sql-no-xid", "undo_sql-to-url", "postgres-to-folder", "delta-to-url"])
def test_dag_params_that_do_not_fit_together_are_refused_before_any_work(params, message):
    from slotlake.airflow.recover_dag import recover_from_params
    from slotlake.config import parse_config

    cfg = parse_config({"lake": "/nonexistent", "sources": {"s": {"dsn": "postgresql://u@127.0.0.1:1/d"}}})
    with pytest.raises(ConfigError, match=message):
        recover_from_params(cfg, "s", {"tables": ["public.a"], "as_of": "0/1", **params})


def test_undo_sql_without_the_undo_module_says_it_is_not_available(monkeypatch):
    import sys

    from slotlake.airflow.recover_dag import recover_from_params
    from slotlake.config import parse_config

    monkeypatch.setitem(sys.modules, "slotlake.recover.undo", None)  # a build without `slotlake undo`
    cfg = parse_config({"lake": "/nonexistent", "sources": {"s": {"dsn": "postgresql://u@127.0.0.1:1/d"}}})
    with pytest.raises(ConfigError, match="mode undo_sql is not available yet"):
        recover_from_params(cfg, "s", {"mode": "undo_sql", "xid": 5, "destination": "/tmp/u.sql"})


def test_archive_gaps_lie_between_the_old_slots_last_bronze_end_and_each_resync():
    from slotlake.recover.point import archive_gaps

    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    ends = [Lsn(150), Lsn(300), Lsn(900)]  # 150, 300: the first slot's files; 900: the second slot's
    # the reach recorded at the resync (an idle extract may have covered past the last bronze file): it counts
    [gap] = archive_gaps(ends, [(Lsn(100), t0, None), (Lsn(500), t1, Lsn(420))])
    assert (gap.archived_end, gap.resumed, gap.resumed_at) == (Lsn(420), Lsn(500), t1)
    assert [x for x in (420, 421, 498, 499, 500) if gap.holds(Lsn(x))] == [421, 498]  # 499: the new copy's state
    # not recorded (an older lake): the old slot's newest bronze end before the new consistent point
    [gap] = archive_gaps(ends, [(Lsn(100), t0, None), (Lsn(500), t1, None)])
    assert gap.archived_end == Lsn(300)
    assert archive_gaps(ends, [(Lsn(100), t0, None)]) == []  # no resync, no gap
    # an old slot that archived nothing: its archive ends at its own copy's watermark
    [gap] = archive_gaps([Lsn(900)], [(Lsn(100), t0, None), (Lsn(500), t1, None)])
    assert gap.archived_end == Lsn(99)
    assert archive_gaps([Lsn(498)], [(Lsn(100), t0, None), (Lsn(500), t1, None)]) == []  # nothing strictly inside
    assert archive_gaps(ends, [(Lsn(100), t0, None), (Lsn(500), t1, Lsn(498))]) == []  # the archive reached C

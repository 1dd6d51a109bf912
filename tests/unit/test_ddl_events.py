"""parse_ddl_event: the pure parser of `slotlake.ddl` message payloads (format of sql/ddl_capture.sql)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from slotlake.decode.messages import ReplicaIdentity
from slotlake.errors import DecodeError
from slotlake.source.ddl import ColumnDef, DdlEvent, DroppedTable, TableDef, parse_ddl_event, table_def_from_json

pytestmark = pytest.mark.unit

# Captured from PostgreSQL 15 (pg_logical_slot_peek_binary_changes, pgoutput Message content) after
#   CREATE TABLE public.accounts (id bigint NOT NULL, email varchar(80) NOT NULL, "Balance" numeric(12,2)
#     DEFAULT 0, note text); CREATE UNIQUE INDEX accounts_email ON public.accounts (email);
#   ALTER TABLE public.accounts ALTER COLUMN note SET NOT NULL, REPLICA IDENTITY USING INDEX accounts_email;
#   DROP TABLE public.accounts
CAPTURED_ALTER = (
    b'{"event": "ddl_command_end", "query": "ALTER TABLE public.accounts ALTER COLUMN note SET NOT NULL, REPLICA '
    b'IDENTITY USING INDEX accounts_email", "tables": [{"oid": 16393, "kind": "r", "name": "accounts", "schema": '
    b'"public", "columns": [{"name": "id", "attnum": 1, "is_key": false, "typmod": -1, "default": null, '
    b'"identity": "", "not_null": true, "type_oid": 20, "generated": "", "type_name": "bigint"}, {"name": '
    b'"email", "attnum": 2, "is_key": true, "typmod": 84, "default": null, "identity": "", "not_null": true, '
    b'"type_oid": 1043, "generated": "", "type_name": "character varying(80)"}, {"name": "Balance", "attnum": 3, '
    b'"is_key": false, "typmod": 786438, "default": "0", "identity": "", "not_null": false, "type_oid": 1700, '
    b'"generated": "", "type_name": "numeric(12,2)"}, {"name": "note", "attnum": 4, "is_key": false, "typmod": '
    b'-1, "default": null, "identity": "", "not_null": true, "type_oid": 25, "generated": "", "type_name": '
    b'"text"}], "replica_identity": "i"}], "objects": [{"oid": 16393, "schema": "public", "identity": '
    b'"public.accounts", "command_tag": "ALTER TABLE", "object_type": "table"}], "version": 1, "command_tag": '
    b'"ALTER TABLE", "query_truncated": false}')
CAPTURED_DROP = (
    b'{"event": "sql_drop", "query": "DROP TABLE public.accounts", "dropped": [{"oid": 16393, "name": "accounts", '
    b'"schema": "public", "identity": "public.accounts"}], "objects": [{"oid": 16393, "schema": "public", '
    b'"identity": "public.accounts", "command_tag": "DROP TABLE", "object_type": "table"}], "version": 1, '
    b'"command_tag": "DROP TABLE", "query_truncated": false}')


def _column(**over: Any) -> dict[str, Any]:
    col = {"attnum": 1, "name": "id", "type_oid": 23, "type_name": "integer", "typmod": -1, "not_null": True,
           "default": None, "is_key": True, "generated": "", "identity": ""}
    col.update(over)
    return col


def _table(**over: Any) -> dict[str, Any]:
    t = {"oid": 16400, "schema": "public", "name": "orders", "kind": "r", "replica_identity": "d",
         "columns": [_column(),
                     _column(attnum=3, name="status", type_oid=1043, type_name="character varying(20)", typmod=24,
                             default="'new'::character varying", is_key=False)]}
    t.update(over)
    return t


def _event(**over: Any) -> dict[str, Any]:
    e = {"version": 1, "event": "ddl_command_end", "command_tag": "ALTER TABLE",
         "query": "ALTER TABLE orders ADD COLUMN status varchar(20) NOT NULL DEFAULT 'new'", "query_truncated": False,
         "objects": [{"command_tag": "ALTER TABLE", "object_type": "table", "schema": "public",
                      "identity": "public.orders", "oid": 16400}],
         "tables": [_table()]}
    e.update(over)
    return e


def _payload(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_captured_alter_event():
    e = parse_ddl_event(CAPTURED_ALTER)
    assert (e.version, e.event, e.command_tag, e.is_error) == (1, "ddl_command_end", "ALTER TABLE", False)
    assert e.query.startswith("ALTER TABLE public.accounts ALTER COLUMN note SET NOT NULL")
    assert e.object_identity == "public.accounts"
    (t,) = e.tables
    assert (t.oid, t.qualified_name, t.replica_identity, t.kind) == (16393, "public.accounts", ReplicaIdentity.INDEX,
                                                                     "r")
    assert t.key_columns == ("email",)
    assert t.columns[2] == ColumnDef(attnum=3, name="Balance", type_oid=1700, type_name="numeric(12,2)",
                                     typmod=786438, not_null=False, default="0", is_key=False)
    assert [c.not_null for c in t.columns] == [True, True, False, True]
    assert e.dropped == ()


def test_captured_drop_event():
    e = parse_ddl_event(CAPTURED_DROP)
    assert (e.event, e.command_tag, e.tables) == ("sql_drop", "DROP TABLE", ())
    assert e.dropped == (DroppedTable(oid=16393, schema="public", name="accounts"),)


def test_hand_written_event_round_trip():
    e = parse_ddl_event(_payload(_event()))
    assert e == DdlEvent(
        version=1, event="ddl_command_end", command_tag="ALTER TABLE",
        query="ALTER TABLE orders ADD COLUMN status varchar(20) NOT NULL DEFAULT 'new'", query_truncated=False,
        objects=e.objects, dropped=(),
        tables=(TableDef(oid=16400, schema="public", name="orders", replica_identity=ReplicaIdentity.DEFAULT,
                         columns=(ColumnDef(1, "id", 23, "integer", -1, True, None, True),
                                  ColumnDef(3, "status", 1043, "character varying(20)", 24, True,
                                            "'new'::character varying", False))),))
    assert e.objects[0].identity == "public.orders" and e.objects[0].oid == 16400


def test_accepts_memoryview_and_non_ascii():
    t = _table(name="bestellungen_ü", columns=[_column(name="größe")])
    e = parse_ddl_event(memoryview(json.dumps(_event(tables=[t]), ensure_ascii=False).encode("utf-8")))
    assert e.tables[0].name == "bestellungen_ü" and e.tables[0].columns[0].name == "größe"


def test_unknown_keys_are_ignored_within_a_version():
    # the SQL may add keys within format version 1; older parsers must keep working
    t = _table(relpersistence="p", columns=[_column(collation="C")])
    e = parse_ddl_event(_payload(_event(tables=[t], trigger_version="1.1")))
    assert e.tables[0].columns[0].name == "id"


def test_optional_keys_default():
    col = {k: v for k, v in _column().items() if k not in ("default", "generated", "identity")}
    t = {k: v for k, v in _table(columns=[col]).items() if k != "kind"}
    e = parse_ddl_event(_payload({"version": 1, "event": "ddl_command_end", "command_tag": "CREATE TABLE",
                                  "tables": [t]}))
    assert e.query is None and e.query_truncated is False and e.objects == () and e.object_identity is None
    c = e.tables[0].columns[0]
    assert (c.default, c.generated, c.identity, e.tables[0].kind) == (None, "", "", "r")


def test_error_event():
    e = parse_ddl_event(_payload({"version": 1, "event": "error", "trigger": "ddl_command_end",
                                  "command_tag": "CREATE TABLE", "query": "CREATE TABLE x (id int)",
                                  "error": {"sqlstate": "XX000", "message": "cache lookup failed", "detail": None,
                                            "context": "PL/pgSQL function ..."}}))
    assert e.is_error and e.error == "XX000: cache lookup failed"
    assert e.tables == () and e.dropped == () and e.query == "CREATE TABLE x (id int)"


def test_object_identity_prefers_the_table():
    objects = [{"command_tag": "CREATE SEQUENCE", "object_type": "sequence", "schema": "public",
                "identity": "public.orders_id_seq", "oid": 1},
               {"command_tag": "CREATE TABLE", "object_type": "table", "schema": "public",
                "identity": "public.orders", "oid": 2}]
    assert parse_ddl_event(_payload(_event(objects=objects))).object_identity == "public.orders"
    assert parse_ddl_event(_payload(_event(objects=objects[:1]))).object_identity == "public.orders_id_seq"


def test_replicated_columns_leave_out_generated_columns():
    t = table_def_from_json(_table(columns=[_column(), _column(attnum=2, name="total", generated="s", is_key=False),
                                            _column(attnum=4, name="qty", is_key=False)]))
    assert [(c.attnum, c.name) for c in t.replicated_columns] == [(1, "id"), (4, "qty")]
    assert len(t.columns) == 3


def test_table_def_from_json_is_the_shared_shape():
    t = table_def_from_json(_table(replica_identity="f", columns=[_column(), _column(attnum=2, name="x")]))
    assert t.replica_identity is ReplicaIdentity.FULL and [c.attnum for c in t.columns] == [1, 2]


@pytest.mark.parametrize("payload, message", [
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"{not json", "not UTF-8 JSON"),
    (b"[1, 2]", "expected an object"),
    (_payload({"event": "sql_drop"}), "'version' is missing"),
    (_payload(_event(version="1")), "'version' must be an integer"),
    (_payload(_event(version=True)), "'version' must be an integer"),
    (_payload(_event(version=0)), "version must be >= 1"),
    (_payload(_event(version=2)), "format version 2, this slotlake reads up to 1: upgrade slotlake"),
    (_payload(_event(event="ddl_command_start")), "event must be one of"),
    (_payload({k: v for k, v in _event().items() if k != "command_tag"}), "'command_tag' is missing"),
    (_payload(_event(tables={"oid": 1})), "'tables' must be a list"),
    (_payload(_event(tables=[_table(replica_identity="x")])), r"tables\[0\]: replica_identity must be one of"),
    (_payload(_event(tables=[_table(oid="16400")])), r"tables\[0\]: 'oid' must be an integer"),
    (_payload(_event(tables=[_table(columns=[_column(name=None)])])), r"tables\[0\]\.columns\[0\]: 'name' is missing"),
    (_payload(_event(tables=[_table(columns=[_column(attnum=True)])])), "'attnum' must be an integer"),
    (_payload(_event(tables=[_table(columns=[_column(not_null=1)])])), "'not_null' must be a boolean"),
    (_payload(_event(tables=[_table(columns=[_column(typmod="-1")])])), "'typmod' must be an integer"),
    (_payload(_event(tables=[_table(columns=[_column(attnum=2), _column(attnum=1)])])), "unique and ascending"),
    (_payload(_event(tables=[_table(columns=[_column(), _column()])])), "unique and ascending"),
    (_payload(_event(tables=["public.orders"])), "expected an object"),
    (_payload(_event(event="sql_drop", dropped=[{"oid": 1, "schema": "public"}])), r"dropped\[0\]: 'name' is missing"),
    (_payload(_event(event="error")), "'error' is missing"),
], ids=["not-utf8", "not-json", "array", "no-version", "version-text", "version-bool", "version-0", "newer-version",
        "unknown-event", "no-tag", "tables-not-list", "bad-identity", "oid-text", "column-no-name", "attnum-bool",
        "not-null-int", "typmod-text", "attnums-unordered", "attnums-duplicate", "table-not-object",
        "dropped-no-name", "error-without-error"])
def test_malformed_payloads_are_decode_errors(payload: bytes, message: str):
    with pytest.raises(DecodeError, match=message):
        parse_ddl_event(payload)

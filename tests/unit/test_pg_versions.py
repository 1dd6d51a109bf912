"""Pure logic around PostgreSQL versions: server version lines, the `origin` source option, slot invalidation
messages, PostgreSQL-style durations."""
from __future__ import annotations

import pytest

from slotlake.config import parse_config
from slotlake.errors import ConfigError, PreflightError
from slotlake.lsn import Lsn
from slotlake.source.extract import origin_option
from slotlake.source.slot import SlotInfo, format_seconds, lost_slot_message
from slotlake_dev.localpg import parse_major

pytestmark = pytest.mark.unit


def _source(**extra):
    raw = {"lake": "./lake", "sources": {"shop": {"dsn": "postgresql://u@h/db", "tables": ["public.a"], **extra}}}
    return parse_config(raw).source("shop")


@pytest.mark.parametrize("line, major", [
    ("postgres (PostgreSQL) 18.6\n", 18),
    ("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n", 15),
    ("postgres (PostgreSQL) 19devel", 19),
    ("postgres (PostgreSQL) 18beta1", 18),
], ids=["embedded-18", "debian-15", "devel", "beta"])
def test_parse_major(line, major):
    assert parse_major(line) == major


def test_parse_major_refuses_other_output():
    with pytest.raises(ValueError, match="not a `postgres --version` line"):
        parse_major("psql (PostgreSQL)")


def test_origin_defaults_to_any_and_is_validated():
    assert _source().origin == "any"
    assert _source(origin="none").origin == "none"
    with pytest.raises(ConfigError, match=r"sources.shop.origin: 'local' must be any .* or none"):
        _source(origin="local")


@pytest.mark.parametrize("origin, version, expected", [
    ("any", 150014, None), ("any", 180006, None), ("none", 160000, "none"), ("none", 180006, "none"),
], ids=["any-15", "any-18", "none-16", "none-18"])
def test_origin_option(origin, version, expected):
    assert origin_option(_source(origin=origin), version) == expected


def test_origin_none_before_16_is_refused_with_the_fix():
    with pytest.raises(PreflightError, match=r"origin: none needs PostgreSQL 16 or newer .* the server is 15; "
                                             r"remove sources.shop.origin or set it to any"):
        origin_option(_source(origin="none"), 150014)


@pytest.mark.parametrize("seconds, text", [(45, "45s"), (60, "1min"), (5400, "90min"), (7200, "2h"),
                                           (86400, "1d"), (90, "90s")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def _slot(reason: str | None, wal_status: str = "lost") -> SlotInfo:
    return SlotInfo(name="slotlake_shop", plugin="pgoutput", slot_type="logical", database="shop", active=False,
                    wal_status=wal_status, restart_lsn=None, confirmed_flush_lsn=Lsn.parse("0/16F27C0"),
                    invalidation_reason=reason)


@pytest.mark.parametrize("reason, idle, fragment", [
    ("idle_timeout", 3600, "was invalidated (idle_timeout): it was unused for longer than the server's "
                           "idle_replication_slot_timeout (1h), so changes after 0/16F27C0 are lost; run "
                           "`slotlake resync shop`, then sync more often than that or raise "
                           "idle_replication_slot_timeout"),
    (None, None, "was invalidated (wal_removed): the server removed WAL the slot still needed, so changes after "
                 "0/16F27C0 are lost; run `slotlake resync shop`"),
    ("rows_removed", None, "was invalidated (rows_removed): it can no longer be read, so changes after 0/16F27C0 "
                           "are lost; run `slotlake resync shop`"),
], ids=["idle-timeout-18", "wal-removed-before-17", "rows-removed"])
def test_lost_slot_message(reason, idle, fragment):
    assert lost_slot_message(_slot(reason), "shop", idle) == f"slot slotlake_shop {fragment}"


@pytest.mark.parametrize("version, options", [
    (150014, "publish_via_partition_root = true"),
    (170000, "publish_via_partition_root = true"),
    (180006, "publish_via_partition_root = true, publish_generated_columns = stored"),
], ids=["15", "17", "18"])
def test_publication_options(version, options):
    from slotlake.source.preflight import publication_options

    assert publication_options(version) == options


def _items(generated_published: bool = False):
    from dataclasses import replace

    from slotlake.decode.messages import ReplicaIdentity
    from slotlake.source.ddl import ColumnDef, TableDef

    def col(attnum, name, generated=""):
        return ColumnDef(attnum=attnum, name=name, type_oid=23, type_name="integer", typmod=-1, not_null=False,
                         default=None, is_key=attnum == 1, generated=generated)

    table = TableDef(oid=10, schema="public", name="items", replica_identity=ReplicaIdentity.DEFAULT,
                     columns=(col(1, "id"), col(2, "qty"), col(3, "double_qty", "s"), col(4, "note")))
    return replace(table, generated_published=generated_published)


def test_replicated_columns_follow_the_publication_setting():
    assert [c.name for c in _items().replicated_columns] == ["id", "qty", "note"]
    assert [c.name for c in _items(True).replicated_columns] == ["id", "qty", "double_qty", "note"]


def test_ddl_events_take_the_setting_of_the_slot_they_were_decoded_from():
    """A DDL event gets the generated-column setting of the newest bootstrap read (slot creation) at or before it:
    a resync onto a publication that publishes generated columns changes it from that slot on."""
    from slotlake.catalog import table_def_definition
    from slotlake.source.catalog_read import BootstrapCatalog, as_published

    boots = [BootstrapCatalog(lsn=Lsn(100), tables=(), path="a", generated_published=False),
             BootstrapCatalog(lsn=Lsn(500), tables=(), path="b", generated_published=True)]
    event = _items()
    assert not as_published(event, boots, 50).generated_published  # before any slot: pgoutput's default
    assert not as_published(event, boots, 499).generated_published
    assert as_published(event, boots, 500).generated_published
    positions = [(c.position, c.name) for c in table_def_definition(600, 600, as_published(event, boots, 600),
                                                                    "ddl").columns]
    assert positions == [(1, "id"), (2, "qty"), (3, "double_qty"), (4, "note")]

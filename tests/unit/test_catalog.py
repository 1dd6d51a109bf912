"""Catalog versioning (pure): a new version only when the definition changes; idempotent on re-runs."""
from __future__ import annotations

import pytest

from slotlake.catalog import (
    TableDefinition,
    apply_definitions,
    drop_definition,
    table_def_definition,
    type_name,
    version_at,
)
from slotlake.decode.messages import Column, Relation, ReplicaIdentity
from slotlake.decode.relations import relation_definition

pytestmark = pytest.mark.unit

A = Relation(10, "public", "orders", ReplicaIdentity.DEFAULT, (Column("id", 23, -1, True), Column("v", 25, -1, False)))


def seen(commit_lsn: int, rel: Relation = A, lsn: int | None = None, types=None) -> TableDefinition:
    return relation_definition(commit_lsn, lsn if lsn is not None else commit_lsn - 1, rel, types or {})


def apply_relations(current, defs):
    return apply_definitions(current, defs)


def with_(rel: Relation, **kw) -> Relation:
    from dataclasses import replace

    return replace(rel, **kw)


def test_first_definition_is_version_1_and_repeats_add_nothing():
    versions, added = apply_relations([], [seen(100), seen(200), seen(300)])
    assert added == 1 and len(versions) == 1
    v = versions[0]
    assert (v.version, v.valid_from_lsn, v.valid_to_lsn, v.origin) == (1, 100, None, "relation")
    assert [(c.position, c.name, c.type_name, c.is_key, c.nullable) for c in v.columns] == [
        (1, "id", "int4", True, None), (2, "v", "text", False, None)]


@pytest.mark.parametrize(
    "changed",
    [
        with_(A, name="orders_renamed"),
        with_(A, schema="sales"),
        with_(A, replica_identity=ReplicaIdentity.FULL),
        with_(A, columns=A.columns + (Column("n", 20, -1, False),)),
        with_(A, columns=(A.columns[0], Column("v", 1043, 54, False))),
        with_(A, columns=(A.columns[0], Column("w", 25, -1, False))),
        with_(A, columns=(Column("id", 23, -1, False), A.columns[1])),
    ],
    ids=["rename-table", "move-schema", "replica-identity", "add-column", "retype-column", "rename-column",
         "key-flag"],
)
def test_each_kind_of_change_opens_a_version_and_closes_the_previous(changed):
    versions, added = apply_relations([], [seen(100), seen(200, changed), seen(300, changed)])
    assert added == 2
    v1, v2 = versions
    assert (v1.version, v1.valid_from_lsn, v1.valid_to_lsn) == (1, 100, 200)
    assert (v2.version, v2.valid_from_lsn, v2.valid_to_lsn) == (2, 200, None)
    assert version_at(versions, 10, 150) == v1 and version_at(versions, 10, 200) == v2
    assert version_at(versions, 10, 99) is None


def test_rerun_over_the_same_definitions_is_idempotent():
    b = with_(A, name="b")
    defs = [seen(100), seen(200, b), seen(300, A)]  # A -> B -> back to A
    first, added = apply_relations([], defs)
    assert added == 3 and [v.table_name for v in first] == ["orders", "b", "orders"]
    again, added_again = apply_relations(first, defs)
    assert added_again == 0 and again == first


def test_definitions_are_applied_in_commit_order_whatever_the_input_order():
    b = with_(A, name="b")
    versions, _ = apply_relations([], [seen(200, b), seen(100)])
    assert [(v.table_name, v.valid_from_lsn, v.valid_to_lsn) for v in versions] == [
        ("orders", 100, 200), ("b", 200, None)]


def test_nullability_and_custom_type_names_carry_over():
    from dataclasses import replace

    mood = with_(A, columns=A.columns + (Column("m", 16500, -1, False),))
    first, _ = apply_relations([], [seen(100, mood, types={16500: "public.mood"})])
    assert first[0].columns[2].type_name == "public.mood"
    boot = replace(first[0], columns=tuple(replace(c, nullable=c.name != "id") for c in first[0].columns),
                   origin="bootstrap")
    renamed = with_(mood, name="orders2")
    versions, _ = apply_relations([boot], [seen(200, renamed)])
    assert [c.nullable for c in versions[1].columns] == [False, True, True]
    assert versions[1].columns[2].type_name == "public.mood"  # no Type message this time: from the previous version
    assert type_name(99999, {}) is None


def test_relations_are_versioned_independently():
    other = Relation(11, "public", "items", ReplicaIdentity.NOTHING, (Column("x", 20, -1, False),))
    versions, added = apply_relations([], [seen(100), seen(100, other), seen(200, with_(other, name="i2"))])
    assert added == 3
    assert [(v.rel_oid, v.version, v.valid_to_lsn) for v in versions] == [(10, 1, None), (11, 1, 200), (11, 2, None)]


def test_ddl_event_definition_then_matching_relation_message_and_drop():
    from slotlake.source.ddl import ColumnDef, TableDef

    table = TableDef(oid=10, schema="public", name="orders", replica_identity=ReplicaIdentity.DEFAULT, columns=(
        ColumnDef(attnum=1, name="id", type_oid=23, type_name="integer", typmod=-1, not_null=True, default=None,
                  is_key=True),
        ColumnDef(attnum=2, name="total", type_oid=1700, type_name="numeric(10,2)", typmod=655366, not_null=False,
                  default=None, is_key=False),
        ColumnDef(attnum=3, name="g", type_oid=23, type_name="integer", typmod=-1, not_null=False,
                  default=None, is_key=False, generated="s"),
        ColumnDef(attnum=4, name="v", type_oid=25, type_name="text", typmod=-1, not_null=False, default=None,
                  is_key=False)))
    rel = Relation(10, "public", "orders", ReplicaIdentity.DEFAULT, (
        Column("id", 23, -1, True), Column("total", 1700, 655366, False), Column("v", 25, -1, False)))
    defs = [table_def_definition(100, 90, table, "ddl"), seen(100, rel, lsn=95), seen(300, rel),
            drop_definition(400, 399, 10, "public", "orders")]
    versions, changed = apply_definitions([], defs)
    assert changed == 2  # the DDL version, then its close by the drop; the Relation repeats add nothing
    (v,) = versions
    assert (v.origin, v.valid_from_lsn, v.valid_to_lsn) == ("ddl", 100, 400)
    # The stored generated column is left out (pgoutput does not send it); positions follow pgoutput's order.
    assert [(c.position, c.name, c.type_name, c.nullable, c.is_key) for c in v.columns] == [
        (1, "id", "int4", False, True), (2, "total", "numeric", True, False), (3, "v", "text", True, False)]
    assert apply_definitions(versions, defs) == (versions, 0)


# ---- what the in-process decode may write itself (`only_new_tables`) and its delta-rs commit ---------------------

B = Relation(11, "public", "lines", ReplicaIdentity.FULL, (Column("a", 23, -1, True), Column("b", 25, -1, True)))


def booted(commit_lsn: int, rel: Relation) -> TableDefinition:
    from dataclasses import replace

    return replace(seen(commit_lsn, rel, lsn=commit_lsn), origin="bootstrap")


def test_only_new_tables_bootstrap_definitions_pass_and_every_other_change_does_not():
    from slotlake.catalog import only_new_tables

    first, _ = apply_definitions([], [booted(100, A)])
    assert only_new_tables([], first)  # a first sync
    both, added = apply_definitions(first, [booted(200, B), booted(200, A)])  # a table added, A's repeat
    assert added == 1 and only_new_tables(first, both)
    assert only_new_tables(both, apply_definitions(both, [seen(300, A)])[0])  # a repeat: no change at all
    widened = with_(A, columns=A.columns + (Column("n", 20, -1, False),))
    assert not only_new_tables(both, apply_definitions(both, [booted(300, widened)])[0])  # A's new version
    assert not only_new_tables(both, apply_definitions(both, [seen(300, widened)])[0])
    assert not only_new_tables(both, apply_definitions(both, [drop_definition(300, 299, 10, "public", "orders")])[0])
    c = with_(B, oid=12, name="other")
    assert not only_new_tables(both, apply_definitions(both, [seen(300, c)])[0])  # a new table seen in the stream


def test_catalog_written_without_spark_reads_back_and_is_idempotent_per_end(tmp_path):
    from slotlake import delta_log
    from slotlake.catalog import read_catalog, write_catalog
    from slotlake.lsn import Lsn

    path = str(tmp_path / "_catalog")
    assert read_catalog(None, path) == []
    first, _ = apply_definitions([], [booted(100, A), booted(100, B)])
    write_catalog(None, path, first, source="shop", end_lsn=Lsn(100))
    assert read_catalog(None, path) == first
    assert delta_log.stage_end(path, "catalog") == Lsn(100)
    write_catalog(None, path, [], source="shop", end_lsn=Lsn(100))  # a re-run of the same end: skipped
    assert read_catalog(None, path) == first and delta_log.delta_rs_table(path).version() == 0
    later, _ = apply_definitions(first, [seen(300, with_(A, columns=A.columns[:1]))])
    write_catalog(None, path, later, source="shop", end_lsn=Lsn(300))
    assert read_catalog(None, path) == later and len(later) == 3
    assert delta_log.stage_end(path, "catalog") == Lsn(300) and delta_log.delta_rs_table(path).version() == 1

"""Pure schema-evolution planning (merge/evolution.py) and the on_drop_column config key."""
from __future__ import annotations

import pytest
from pyspark.sql.types import DataType, DecimalType, DoubleType, FloatType, IntegerType, LongType, StringType

from slotlake.config import parse_config
from slotlake.decode.messages import ReplicaIdentity
from slotlake.errors import ConfigError, MergeError
from slotlake.merge.evolution import ColumnHistoryEvent, column_events, constant_default, holds, plan_evolution
from slotlake.merge.plan import TableShape
from slotlake.source.ddl import ColumnDef, TableDef

pytestmark = pytest.mark.unit

INT4, INT8, TEXT, VARCHAR, FLOAT4, FLOAT8 = 23, 20, 25, 1043, 700, 701


def shape(*cols: tuple[str, int], keys=("id",), ri="d") -> TableShape:
    return TableShape("public", "t", tuple(c for c, _ in cols), tuple(o for _, o in cols), (-1,) * len(cols),
                      tuple(keys), ri)


def text(t: DataType) -> str:
    """A Spark type as the pure planner takes and gives it (Spark SQL type text, as Spark prints it)."""
    return t.simpleString()


START = [("id", text(IntegerType())), ("a", text(IntegerType()))]


@pytest.mark.parametrize("expr, want", [
    (None, (True, None)), ("0", (True, "0")), ("-1.5", (True, "-1.5")), ("'dflt'::text", (True, "dflt")),
    ("'it''s'::character varying", (True, "it's")), ("NULL::integer", (True, None)), ("true", (True, "true")),
    ("'2020-01-01'::date", (True, "2020-01-01")), ("now()", (False, None)),
    ("nextval('t_id_seq'::regclass)", (False, None)), ("(1 + 2)", (False, None)),
], ids=["none", "zero", "negative", "text", "quote", "null", "bool", "date", "now", "nextval", "expression"])
def test_constant_default(expr, want):
    assert constant_default(expr) == want


@pytest.mark.parametrize("wide, narrow, ok", [
    (LongType(), IntegerType(), True), (IntegerType(), LongType(), False), (DoubleType(), FloatType(), True),
    (DecimalType(12, 4), DecimalType(10, 2), True), (DecimalType(10, 4), DecimalType(10, 2), False),
    (StringType(), IntegerType(), False),
], ids=["int-long", "long-int", "float-double", "decimal-wider", "decimal-fewer-integer-digits", "int-string"])
def test_holds(wide, narrow, ok):
    assert holds(text(wide), text(narrow)) is ok


def test_added_column_gets_its_constant_default_before_the_add():
    layouts = [(100, shape(("id", INT4), ("a", INT4))), (200, shape(("id", INT4), ("a", INT4), ("c", TEXT)))]
    evo = plan_evolution("public.t", START, layouts, [ColumnHistoryEvent(150, "add", "c", default="'x'::text")],
                         mark=50)
    assert evo.columns == ("id", "a", "c") and [a.name for a in evo.adds] == ["c"]
    assert evo.adds[0].existing_rows == "x" and evo.adds[0].note is None
    assert evo.positions == ((0, 1, None), (0, 1, 2)) and evo.fills == ((None, None, "x"), (None, None, None))


def test_added_column_without_capture_is_reported():
    evo = plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a", INT4), ("c", TEXT)))], [], mark=50,
                         ddl_capture=False)
    assert evo.adds[0].existing_rows is None and "could not see" in evo.notes[0]


def test_volatile_default_is_reported_not_evaluated():
    evo = plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a", INT4), ("e", 1184)))],
                         [ColumnHistoryEvent(90, "add", "e", default="now()")], mark=50)
    assert evo.adds[0].existing_rows is None and "non-constant default now()" in evo.notes[0]


def test_rename_known_from_ddl_moves_the_column():
    layouts = [(100, shape(("id", INT4), ("a2", INT4)))]
    evo = plan_evolution("public.t", START, layouts, [ColumnHistoryEvent(90, "rename", "a2", old_name="a")], mark=50)
    assert evo.renames == (("a", "a2"),) and evo.columns == ("id", "a2") and not evo.adds and not evo.dropped_kept


def test_rename_without_ddl_is_drop_plus_add_and_said():
    evo = plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a2", INT4)))], [], mark=50,
                         ddl_capture=False)
    assert evo.columns == ("id", "a", "a2") and evo.dropped_kept == ("a",) and [a.name for a in evo.adds] == ["a2"]
    assert any("drop plus an add" in n for n in evo.notes)


def test_a_rename_before_the_watermark_is_not_applied_again():
    evo = plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a2", INT4)))],
                         [ColumnHistoryEvent(40, "rename", "a2", old_name="a")], mark=50)
    assert evo.renames == () and evo.dropped_kept == ("a",)


def test_widening_and_narrowing():
    evo = plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a", INT8))),
                                            (200, shape(("id", INT4), ("a", INT4)))], [], mark=50)
    assert evo.widen == (("a", text(LongType())),) and evo.types == (text(IntegerType()), text(LongType()))


def test_type_change_delta_cannot_follow_names_the_remedy():
    with pytest.raises(MergeError, match=r"column a changed type from int to string.*slotlake replay"):
        plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a", TEXT)))], [], mark=50)


def test_drop_kept_or_dropped():
    layouts = [(100, shape(("id", INT4),))]
    kept = plan_evolution("public.t", START, layouts, [], mark=50)
    assert kept.columns == ("id", "a") and kept.dropped_kept == ("a",) and kept.positions == ((0, None),)
    dropped = plan_evolution("public.t", START, layouts, [], mark=50, on_drop_column="drop")
    assert dropped.columns == ("id",) and dropped.drops == ("a",)


def test_layout_that_comes_back_reuses_the_gold_column():
    layouts = [(100, shape(("id", INT4), ("a", INT4), ("c", TEXT))), (200, shape(("id", INT4), ("a", INT4))),
               (300, shape(("id", INT4), ("a", INT4), ("c", TEXT)))]
    evo = plan_evolution("public.t", START, layouts, [], mark=50)
    assert evo.columns == ("id", "a", "c") and evo.positions == ((0, 1, 2), (0, 1, None), (0, 1, 2))
    assert evo.dropped_kept == ()


def test_new_table_is_created_from_its_first_layout():
    evo = plan_evolution("public.t", None, [(100, shape(("id", INT4), ("v", VARCHAR)))], [], mark=-1)
    assert evo.columns == ("id", "v") and not evo.adds and not evo.changes_schema


def test_key_change_within_a_run_is_refused():
    with pytest.raises(MergeError, match="replica identity key changes"):
        plan_evolution("public.t", START, [(100, shape(("id", INT4), ("a", INT4))),
                                           (200, shape(("id", INT4), ("a", INT4), keys=("a",)))], [], mark=50)


def _def(lsn_cols):
    return TableDef(oid=7, schema="public", name="t", replica_identity=ReplicaIdentity.DEFAULT, columns=tuple(
        ColumnDef(attnum=n, name=name, type_oid=INT4, type_name="integer", typmod=-1, not_null=False,
                  default=dflt, is_key=n == 1) for n, name, dflt in lsn_cols))


def test_column_events_by_attnum():
    defs = [(10, _def([(1, "id", None), (2, "a", None)])),
            (20, _def([(1, "id", None), (2, "a", None), (3, "c", "0")])),
            (30, _def([(1, "id", None), (2, "a2", None), (3, "c", "0")])),
            (40, _def([(1, "id", None), (3, "c", "0"), (4, "a2x", None)]))]
    events = [e for e in column_events(defs, "public", "t") if e.kind != "seen"]
    assert [(e.commit_lsn, e.kind, e.name, e.old_name, e.default) for e in events] == [
        (20, "add", "c", None, "0"), (30, "rename", "a2", "a", None), (40, "add", "a2x", None, None)]


def test_on_drop_column_config():
    base = {"lake": "/tmp/l", "sources": {"s": {"dsn": "postgresql://u@h/db"}}}
    assert parse_config(base).source("s").on_drop_column == "keep"
    base["sources"]["s"]["on_drop_column"] = "drop"
    assert parse_config(base).source("s").on_drop_column == "drop"
    base["sources"]["s"]["on_drop_column"] = "forget"
    with pytest.raises(ConfigError, match="sources.s.on_drop_column"):
        parse_config(base)


NUMERIC = 1700


def test_unconstrained_numeric_follows_the_setting_of_its_name():
    layouts = [(100, shape(("id", INT4), ("amount", NUMERIC), ("fee", NUMERIC)))]
    evo = plan_evolution("public.t", None, layouts, [], mark=-1,
                         unconstrained_numeric=lambda c: "string" if c == "amount" else "decimal")
    assert evo.types == (text(IntegerType()), text(StringType()), text(DecimalType(38, 18)))


@pytest.mark.parametrize("gold_type, mode", [(DecimalType(38, 18), "string"), (StringType(), "decimal")],
                         ids=["decimal-to-string", "string-to-decimal"])
def test_changing_the_numeric_setting_of_an_existing_gold_column_names_resync(gold_type, mode):
    start = [("id", text(IntegerType())), ("amount", text(gold_type))]
    with pytest.raises(MergeError) as err:
        plan_evolution("public.t", start, [(100, shape(("id", INT4), ("amount", NUMERIC)))], [], mark=50,
                       unconstrained_numeric=lambda c: mode)
    msg = str(err.value)
    assert f"public.t: column amount (numeric without precision) is {gold_type.simpleString()} in gold" in msg
    assert f"numeric.unconstrained: {mode} maps it to" in msg and "slotlake resync <source>" in msg
    assert "\n" not in msg


def test_a_numeric_losing_its_precision_still_widens_in_decimal_mode():
    # numeric(10,2) -> numeric: decimal(10,2) widens to decimal(38,18), as before the setting existed
    evo = plan_evolution("public.t", [("id", text(IntegerType())), ("amount", text(DecimalType(10, 2)))],
                         [(100, shape(("id", INT4), ("amount", NUMERIC)))], [], mark=50)
    assert evo.widen == (("amount", text(DecimalType(38, 18))),)

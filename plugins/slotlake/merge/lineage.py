"""The MERGE source of a batch: keyed tables by row lineage (key changes, unchanged TOAST filled along the
lineage), FULL tables as multisets of copies (`_slotlake_dup`); see merge/job.py's module text.
"""
from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from slotlake.errors import MergeError
from slotlake.lsn import Lsn
from slotlake.merge.plan import (
    DELETED_COL,
    TablePlan,
)
from slotlake.names import spark_ident as _q

log = logging.getLogger(__name__)

_MAX_LINEAGE_ROUNDS = 64

def value_cols(plan: TablePlan) -> list[Column]:
    return [F.col(f"__n{i}").alias(f"__v{i}") for i in range(len(plan.shape.columns))]


def meta_cols() -> list[Column]:
    return [F.lit("U").alias("__action"), F.col("commit_lsn").alias("__lsn"), F.col("commit_ts").alias("__ts")]


_SEQ_SPAN = 1 << 31  # `seq` is an int (>= 0): commit_lsn * 2^31 + seq orders changes as (commit_lsn, seq) does


_LONG_LSN_SPAN = 1 << 32  # commit LSNs within this of a base: (lsn - base) * 2^31 + seq fits a long


def change_number(base_lsn: int | None = None) -> Column:
    """A change's id (commit_lsn, seq) as one number in the same order: a decimal(31,0), or with `base_lsn` (from
    `long_base`: no commit LSN of the rows is below it or 2^32 or more above it) the long (commit_lsn - base) *
    2^31 + seq. Its min/max is a hash aggregation; a struct's makes Spark sort every row of the batch first
    (SortAggregate: a struct buffer cannot be updated in place). The long's arithmetic per row is ~2-3x cheaper
    than the decimal's (bench/README.md, "The last change per key numbered in a long")."""
    if base_lsn is not None:
        return (F.col("commit_lsn") - F.lit(base_lsn)) * F.lit(_SEQ_SPAN) + F.col("seq")
    return F.col("commit_lsn").cast("decimal(20,0)") * F.lit(_SEQ_SPAN).cast("decimal(10,0)") + F.col("seq")


def long_base(lo_lsn: int | None, hi_lsn: int | None) -> int | None:
    """The `base_lsn` of `change_number` for changes whose commit LSNs lie in [lo_lsn, hi_lsn]: `lo_lsn`, when that
    span is under 2^32 (4 GB of WAL, a sync's batch by far); else None (the decimal)."""
    if lo_lsn is None or hi_lsn is None or not 0 <= hi_lsn - lo_lsn < _LONG_LSN_SPAN:
        return None
    return lo_lsn


def change_of(number) -> tuple[int, int]:
    """(commit_lsn, seq) of a `change_number` value."""
    lsn, seq = divmod(int(number), _SEQ_SPAN)
    return lsn, seq


# ---- keyed tables: lineage ---------------------------------------------------------------------------------

def keyed_states(plan: TablePlan, typed: DataFrame, target: DataFrame | None) -> DataFrame:
    """Every change of a keyed batch with the row state it leaves (`__f{i}`: struct(v), unchanged TOAST filled
    along the row's lineage, seeded by `target`'s row), its old/new key (`__ok`/`__nk`), `__id`, `op`,
    `commit_lsn`, `commit_ts`: the per-change view the history table is built from (merge/history_job.py)."""
    return keyed_source(plan, typed, target, filled_only=True)


def _old_key(plan: TablePlan) -> Column:
    """A change's old key: from the old tuple when there is one (key changed, or a delete), else the key did not
    change. NULL for inserts."""
    return F.when(F.col("op").isin("U", "D"), F.struct(*[
        F.when(F.col("old").isNotNull(), F.col(f"__o{k}")).otherwise(F.col(f"__n{k}")).alias(f"k{j}")
        for j, k in enumerate(plan.key_positions)]))


def _new_key(plan: TablePlan) -> Column:
    """A change's new key (NULL for deletes)."""
    return F.when(F.col("op").isin("I", "U"), F.struct(*[F.col(f"__n{k}").alias(f"k{j}")
                                                         for j, k in enumerate(plan.key_positions)]))


def _moved(old_key: Column, new_key: Column) -> Column:
    """True for an update whose old and new keys differ: the row moved to another key."""
    return (F.col("op") == "U") & ~old_key.eqNullSafe(new_key)


def key_changed(plan: TablePlan) -> Column:
    """`_moved` over the typed columns of `typed_layouts` (no `__ok`/`__nk` columns needed)."""
    return _moved(_old_key(plan), _new_key(plan))


def keyed_source(plan: TablePlan, typed: DataFrame, target: DataFrame | None, *, toast: bool = True,
                 filled_only: bool = False, key_changes: int | None = None,
                 base_lsn: int | None = None) -> DataFrame:
    """One row per key touched: its final state (`__action` U with `__v*`) or its removal (`__action` D).

    `toast`: False when no change of the batch has an unchanged TOAST value (every new tuple is whole).
    `key_changes`: the batch's count of `key_changed` rows when the caller has it (else one more pass finds out).
    `base_lsn`: `long_base` of the batch's commit LSNs, when the caller knows them (its changes are then numbered
    in a long)."""
    cid = F.struct("commit_lsn", "seq")
    ch = typed.withColumn("__id", cid).withColumn("__ok", _old_key(plan)).withColumn("__nk", _new_key(plan))
    moved = _moved(F.col("__ok"), F.col("__nk"))
    if key_changes is None:
        key_changes = ch.where(moved).limit(1).count()
    if key_changes == 0:
        if not toast and not plan.soft_delete and not filled_only:
            return _last_per_key(plan, ch, base_lsn)
        # No key changed in the batch (the usual case): a row's lineage is its key (rid: the key's first change;
        # an insert after a delete writes every column, so sharing the key's lineage fills nothing wrong), and
        # the lineage resolution (several Spark jobs) is not needed.
        first = F.first("__id").over(Window.partitionBy(F.coalesce("__ok", "__nk")).orderBy("__id"))
        return _keyed_final(plan, ch.withColumn("rid", first), target, filled_only)
    links = _lineage_links(ch, moved, plan.shape.qualified)
    return _keyed_final(plan, ch.join(links.select("__id", "rid"), "__id"), target, filled_only)


def _last_per_key(plan: TablePlan, ch: DataFrame, base_lsn: int | None = None) -> DataFrame:
    """`_keyed_final`'s result when no key changed, no change has unchanged TOAST and deletes are hard: each key's
    last change is its whole final state (an insert or update carries every column; a delete's values are not
    used), so one hash aggregation finds it, pre-aggregated before the shuffle (a hot row updated thousands of
    times in a batch leaves each task as one row), instead of three window passes over the batch."""
    ncols = len(plan.shape.columns)
    nkeys = len(plan.key_positions)
    key = F.coalesce("__ok", "__nk")  # no key changed: each change touches one key
    # The key's last change by its number: a hash aggregation (a max_by of the row struct sorts the whole batch),
    # then the changes themselves by a semi join (a change's number is unique in the batch).
    number = change_number(base_lsn)
    lasts = ch.groupBy(key).agg(F.max(number).alias("__last")).select("__last")
    last = ch.join(lasts, number == F.col("__last"), "left_semi")
    return last.select(*[key.getField(f"k{j}").alias(f"__k{j}") for j in range(nkeys)],
                       F.when(F.col("op") == "D", "D").otherwise("U").alias("__action"),
                       *[F.col(f"__n{i}").alias(f"__v{i}") for i in range(ncols)],
                       F.col("commit_lsn").alias("__lsn"), F.col("commit_ts").alias("__ts"),
                       F.lit(False).alias("__partial"))


def _lineage_links(ch: DataFrame, moved: Column, name: str) -> DataFrame:
    """(__id, rid): for every change, the first change of the row lineage it belongs to, following key changes."""
    # Events per key: a change leaves its old key (delete, key change), stays (in-place update) or arrives.
    events = (ch.where(F.col("op").isin("U", "D"))
              .select("__id", F.col("__ok").alias("key"),
                      F.when((F.col("op") == "U") & ~moved, "stay").otherwise("leave").alias("kind"))
              .unionByName(ch.where((F.col("op") == "I") | moved)
                           .select("__id", F.col("__nk").alias("key"), F.lit("arrive").alias("kind"))))
    w = Window.partitionBy("key").orderBy("__id")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    events = (events
              .withColumn("prev", F.last(F.when(F.col("kind").isin("arrive", "leave"), F.struct("kind", "__id")),
                                         ignorenulls=True).over(before))
              .withColumn("first_id", F.first("__id").over(w.rowsBetween(Window.unboundedPreceding, 0))))
    touching = events.where(F.col("kind") != "arrive")
    # Link of each change to the lineage it continues: itself (insert), the gold row (rid = first change on the
    # key, which has no earlier arrival), or the change that last brought a row to this key (resolved below).
    # `broken`: the key was left by an earlier change and nothing arrived since: an inconsistent stream.
    links = (touching.select(
        "__id",
        F.when(F.col("prev").isNull(), F.col("first_id")).alias("rid"),
        F.when(F.col("prev.kind") == "arrive", F.col("prev.__id")).alias("ptr"),
        F.when(F.col("prev.kind") == "leave", F.col("key")).alias("broken"))
        .unionByName(ch.where(F.col("op") == "I").select("__id", F.col("__id").alias("rid")),
                     allowMissingColumns=True)).localCheckpoint()
    broken = links.where(F.col("broken").isNotNull()).limit(1).collect()
    if broken:
        b = broken[0]
        raise MergeError(f"{name}: the change at LSN {Lsn(b['__id']['commit_lsn'])} (seq {b['__id']['seq']}) "
                         f"updates or deletes key {b['broken']} after an earlier change in the batch removed it; "
                         "the silver changes are inconsistent (were they decoded twice or out of order?)")
    return _resolve_lineage(links, name)


def _keyed_final(plan: TablePlan, ch: DataFrame, target: DataFrame | None, filled_only: bool = False) -> DataFrame:
    """From the changes with their lineage (`rid`: the lineage's first change) to one MERGE source row per key."""
    shape = plan.shape
    ncols = len(shape.columns)
    keys = plan.key_positions
    # Fill unchanged TOAST along each lineage, seeded by the gold row when the lineage starts from it.
    rows = ch.withColumn("__sub", F.lit(1))
    rows = rows.select("rid", "__id", "__sub", "op", "__ok", "__nk", "commit_lsn", "commit_ts", *[
        F.when((F.col("op") == "D") | F.col(f"__u{i}"), F.lit(None)).otherwise(F.struct(F.col(f"__n{i}").alias("v")))
        .alias(f"__w{i}") for i in range(ncols)])
    if target is not None:
        live = target if not plan.soft_delete else target.where(~F.col(DELETED_COL))
        roots = rows.where((F.col("rid") == F.col("__id")) & (F.col("op") != "I"))
        cond = and_all([roots["__ok"].getField(f"k{j}").eqNullSafe(live[_q(shape.columns[k])])
                     for j, k in enumerate(keys)])
        seeds = roots.join(live, cond).select(
            "rid", F.col("rid").alias("__id"), F.lit(0).alias("__sub"),
            *[F.struct(live[_q(c)].alias("v")).alias(f"__w{i}") for i, c in enumerate(shape.columns)])
        rows = rows.unionByName(seeds, allowMissingColumns=True)
    by_rid = Window.partitionBy("rid").orderBy("__id", "__sub")
    lw = by_rid.rowsBetween(Window.unboundedPreceding, 0)
    # Soft deletes keep the row under its old key as it was there: the lineage's state BEFORE the leaving change
    # (for a key change that is not the new row, whose new key would otherwise land on the deleted row).
    prior = ([F.last(f"__w{i}", ignorenulls=True).over(by_rid.rowsBetween(Window.unboundedPreceding, -1))
              .alias(f"__p{i}") for i in range(ncols)] if plan.soft_delete else [])
    filled = rows.select("__id", "__sub", "op", "__ok", "__nk", "commit_lsn", "commit_ts",
                         *[F.last(f"__w{i}", ignorenulls=True).over(lw).alias(f"__f{i}") for i in range(ncols)],
                         *prior).where(F.col("__sub") == 1)
    if filled_only:
        return filled

    def state(pre: str) -> list[Column]:
        missing = F.array_compact(F.array(*[F.when(F.col(f"{pre}{i}").isNull(), F.lit(c))
                                            for i, c in enumerate(shape.columns)]))
        return ([F.col(f"{pre}{i}.v").alias(f"__v{i}") for i in range(ncols)]
                + [F.col("commit_lsn").alias("__lsn"), F.col("commit_ts").alias("__ts"), missing.alias("__missing")])

    leaving = filled.where((F.col("op") == "D") | _moved(F.col("__ok"), F.col("__nk")))
    final = (leaving.select(F.col("__ok").alias("key"), "__id", F.lit("D").alias("__action"),
                            *state("__p" if plan.soft_delete else "__f"))
             .unionByName(filled.where(F.col("op").isin("I", "U"))
                          .select(F.col("__nk").alias("key"), "__id", F.lit("U").alias("__action"), *state("__f"))))
    final = (final.withColumn("__rn", F.row_number().over(Window.partitionBy("key").orderBy(F.col("__id").desc())))
             .where(F.col("__rn") == 1)).localCheckpoint()  # checked below, then merged: compute once
    gap = final.where((F.col("__action") == "U") & (F.size("__missing") > 0)).limit(1).collect()
    if gap:
        g = gap[0]
        key = {shape.columns[k]: g["key"][f"k{j}"] for j, k in enumerate(keys)}
        raise MergeError(
            f"{shape.qualified}: row {key} written at LSN {Lsn(g['__id']['commit_lsn'])} has unchanged TOAST "
            f"column(s) {list(g['__missing'])} whose value is neither in gold nor in an earlier change of this batch; "
            "the gold table is missing the row (was it loaded by an initial snapshot?). Reload the table to fix it")
    return final.select(*[F.col("key").getField(f"k{j}").alias(f"__k{j}") for j in range(len(keys))],
                        "__action", *[f"__v{i}" for i in range(ncols)], "__lsn", "__ts",
                        (F.size("__missing") > 0).alias("__partial"))


def _resolve_lineage(links: DataFrame, name: str) -> DataFrame:
    """Pointer jumping until every change knows the first change of its lineage (`rid`).

    Only chains through key changes need rounds: one per doubling of the longest chain of key changes.
    """
    for _ in range(_MAX_LINEAGE_ROUNDS):
        if links.where(F.col("rid").isNull()).limit(1).count() == 0:
            return links.select("__id", "rid")
        p = links.select(F.col("__id").alias("__pid"), F.col("rid").alias("__prid"), F.col("ptr").alias("__pptr"))
        nxt = links.join(p, links["ptr"] == p["__pid"], "left")
        lost = nxt.where(F.col("rid").isNull() & F.col("__pid").isNull()).limit(1).collect()
        if lost:
            raise MergeError(f"{name}: change {lost[0]['__id']} continues a row whose earlier change is missing "
                             "from the batch; the silver changes are inconsistent")
        links = nxt.select("__id", F.coalesce("rid", "__prid").alias("rid"),
                           F.when(F.col("rid").isNull() & F.col("__prid").isNull(), F.col("__pptr")).alias("ptr")
                           ).localCheckpoint()
    raise MergeError(f"{name}: key-change chains longer than 2^{_MAX_LINEAGE_ROUNDS} in one batch")


def and_all(conds: list[Column]) -> Column:
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


# ---- FULL tables: multisets --------------------------------------------------------------------------------

def full_row_source(plan: TablePlan, typed: DataFrame, target: DataFrame | None) -> DataFrame:
    """Per distinct row the copies to add (`U`, copy numbers above the current count) or remove (`D`, the top ones)."""
    shape = plan.shape
    ncols = len(shape.columns)
    old_row = F.struct(*[F.col(f"__o{i}").alias(f"c{i}") for i in range(ncols)])
    # Unchanged TOAST in the new tuple: REPLICA IDENTITY FULL logs the whole old row, so the value is right there.
    new_row = F.struct(*[F.when(F.col(f"__u{i}"), F.col(f"__o{i}")).otherwise(F.col(f"__n{i}")).alias(f"c{i}")
                         for i in range(ncols)])
    cid = F.struct("commit_lsn", "seq")
    moves = (typed.where(F.col("op").isin("I", "U"))
             .select(new_row.alias("row"), F.lit(1).alias("sign"), cid.alias("__id"), "commit_lsn", "commit_ts")
             .unionByName(typed.where(F.col("op").isin("U", "D"))
                          .select(old_row.alias("row"), F.lit(-1).alias("sign"), cid.alias("__id"), "commit_lsn",
                                  "commit_ts")))
    delta = moves.groupBy("row").agg(F.sum("sign").alias("d"),
                                     F.max_by(F.struct("commit_lsn", "commit_ts"), "__id").alias("last"))
    if target is not None:
        live = target if not plan.soft_delete else target.where(~F.col(DELETED_COL))
        counts = live.select(F.struct(*[F.col(_q(c)).alias(f"c{i}") for i, c in enumerate(shape.columns)])
                             .alias("trow")).groupBy("trow").agg(F.count(F.lit(1)).alias("tc"))
        delta = delta.join(counts, delta["row"].eqNullSafe(counts["trow"]), "left")
        tc = F.coalesce(F.col("tc"), F.lit(0))
    else:
        tc = F.lit(0)
    delta = delta.withColumn("tc", tc).withColumn("nc", F.greatest(F.col("tc") + F.col("d"), F.lit(0)))
    # A delete of a row gold never had (e.g. no initial load yet) removes nothing, as for keyed tables.
    adds = (delta.where(F.col("nc") > F.col("tc"))
            .select("row", "last", F.lit("U").alias("__action"),
                    F.explode(F.sequence(F.col("tc") + 1, F.col("nc"))).alias("__dup")))
    drops = (delta.where(F.col("nc") < F.col("tc"))
             .select("row", "last", F.lit("D").alias("__action"),
                     F.explode(F.sequence(F.col("nc") + 1, F.col("tc"))).alias("__dup")))
    return adds.unionByName(drops).select(
        *[F.col("row").getField(f"c{i}").alias(f"__v{i}") for i in range(ncols)],
        F.col("__dup").cast("int").alias("__dup"), "__action",
        F.col("last.commit_lsn").alias("__lsn"), F.col("last.commit_ts").alias("__ts"))

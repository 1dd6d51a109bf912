"""Gold tables with deletion vectors (config `deletion_vectors`), merged in `slotlake sync`'s own process
(merge/dv_merge.py): a keyed batch marks gold's changed rows in deletion vectors and adds one file of new rows; no
row of gold is rewritten; a FULL-identity table's new rows are one appended file. Next to the same changes through
Spark's MERGE (`spark.in_process_bytes: 0`) from the same database: both lakes' gold equal PostgreSQL and each
other; Spark merges on top of the vectors written here and this process on top of Spark's, also from a checkpoint
(delta-rs's, and the one written here at version 10); delta-rs and Spark read every table alike (the suite's reader
check, after the test)."""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import deltalake
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import launched_apps, slotlake, sync_ok  # noqa: E402
from delta_readers import deletion_vectors, read_delta_rs  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import delta_log  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.merge.dv_merge import ENGINE  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

IN_PROCESS, SPARK = "inproc", "viaspark"
TABLE = "public.items"
FULL = "public.hist"  # REPLICA IDENTITY FULL, no key: its new rows are appended here, any other change is Spark's


def write_configs(tmp_path: Path, dsn: str) -> tuple[Path, Path]:
    out = []
    for source, in_process_bytes in ((IN_PROCESS, None), (SPARK, 0)):
        spark: dict = {"master": "local[2]"}
        if in_process_bytes is not None:
            spark["in_process_bytes"] = in_process_bytes
        cfg = tmp_path / f"{source}.yaml"
        cfg.write_text(json.dumps({"lake": str(tmp_path / f"lake_{source}"), "spark": spark,
                                   "sources": {source: {"dsn": dsn, "tables": [TABLE, FULL],
                                                        "deletion_vectors": True}}}))
        out.append(cfg)
    return out[0], out[1]


def files_of(path: str) -> dict:
    """Each live file's add action as JSON commits alone say (the log replayed from version 0)."""
    files: dict = {}
    for entry in sorted((Path(path) / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        for a in actions:
            if "remove" in a:
                files.pop(a["remove"]["path"], None)
        files.update({a["add"]["path"]: a["add"] for a in actions if "add" in a})
    return files


def gold(tmp_path: Path, source: str, table: str = TABLE) -> str:
    return LakePaths.of(str(tmp_path / f"lake_{source}"), source).gold(*table.split("."))


def rows(path: str) -> collections.Counter:
    table = read_delta_rs(path).to_pylist()
    for r in table:
        if r["_slotlake_commit_ts"] is None:
            r["_slotlake_lsn"] = "copy"  # each lake's copy has its own consistent point
    return collections.Counter(tuple(sorted(r.items())) for r in table)


def test_keyed_batches_mark_rows_in_deletion_vectors_without_spark(pg_db, tmp_path):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, n bigint, d date, ts timestamptz, "
                     "price numeric(10,2), big text)")
        conn.execute("INSERT INTO items SELECT g, 'n' || g, g * 10, DATE '2024-01-01' + g % 300, "
                     "TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * interval '1 s', g * 1.25, NULL "
                     "FROM generate_series(1, 5000) g")
        conn.execute("CREATE TABLE hist (a int, b text)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO hist SELECT g % 10, 'seed' FROM generate_series(1, 30) g")
    cfg, spark_cfg = write_configs(tmp_path, pg_db)
    ours, theirs = gold(tmp_path, IN_PROCESS), gold(tmp_path, SPARK)
    hist = gold(tmp_path, IN_PROCESS, FULL)

    def both(statements: list[str], *, here: bool | None = True) -> dict:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)
        out = sync_ok(cfg, IN_PROCESS, "--json")
        log = out.stderr
        if here:
            assert launched_apps(log) == [] and "(in this process, without Spark)" in log, (statements, log[-3000:])
        elif here is False:
            assert "merge inproc in this process declined" in log and launched_apps(log) == ["merge"], log[-3000:]
        sync_ok(spark_cfg, SPARK)
        assert_gold_equals_pg(ours, pg_db, TABLE)
        assert_gold_equals_pg(theirs, pg_db, TABLE)
        assert rows(ours) == rows(theirs)
        assert_gold_equals_pg(hist, pg_db, FULL)
        assert_gold_equals_pg(gold(tmp_path, SPARK, FULL), pg_db, FULL)
        assert rows(hist) == rows(gold(tmp_path, SPARK, FULL))
        return json.loads(out.stdout)

    def in_process_only(statements: list[str]) -> None:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)
        log = sync_ok(cfg, IN_PROCESS).stderr
        assert launched_apps(log) == [] and "(in this process, without Spark)" in log, (statements, log[-3000:])
        assert_gold_equals_pg(ours, pg_db, TABLE)

    both([], here=None)  # the initial copies (Spark loads them, deletion vectors on)
    assert deletion_vectors(ours) and deletion_vectors(theirs) and deletion_vectors(hist)
    files_before = set(delta_log.snapshot(ours).files)
    big = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
    report = both(["UPDATE items SET name = 'u' || id WHERE id % 97 = 0",
                   *(["UPDATE items SET n = n + 1 WHERE id = 7"] * 20),  # a hot row
                   "DELETE FROM items WHERE id % 101 = 0",
                   "INSERT INTO items (id, name) SELECT g, 'new' FROM generate_series(6000, 6049) g",
                   "DELETE FROM items WHERE id = 6001",  # inserted and deleted in the batch
                   f"UPDATE items SET big = {big} WHERE id IN (3, 4, 5)",
                   "INSERT INTO hist VALUES (100, 'new'), (100, 'new'), (101, NULL)"])  # appended, copies numbered
    merged = {m["table"]: m for m in report["merged"]}[TABLE]
    newest = next(delta_log.commits(ours))
    assert newest.engine == ENGINE and newest.operation == "MERGE", newest
    assert newest.metrics["numTargetRowsCopied"] == 0 and newest.metrics["numTargetDeletionVectorsAdded"] >= 1
    assert (merged["inserted"], merged["deleted"]) == (49, 49), merged  # 5,000 / 101 = 49 rows deleted
    assert merged["updated"] == 51 + 1 + 3, merged  # 5,000 / 97 = 51 (none also a multiple of 101), 7, 3-5
    # no file of gold was rewritten: every file is still there, some with a vector, and one new file
    after = delta_log.snapshot(ours)
    assert files_before <= set(after.files) and len(after.files) == len(files_before) + 1
    assert any(a.get("deletionVector") for a in after.files.values())
    appended = next(delta_log.commits(hist))
    assert (appended.engine, appended.operation, appended.metrics["numOutputRows"]) == (ENGINE, "WRITE", 3)

    # unchanged TOAST values (gold's, and an earlier change's of the batch), key changes, a key taken again
    both(["UPDATE items SET name = 'toast' WHERE id = 3",
          f"UPDATE items SET big = {big} WHERE id = 4", "UPDATE items SET n = -4 WHERE id = 4",
          "UPDATE items SET n = 5 WHERE id = 5", "DELETE FROM items WHERE id = 5"])
    both(["UPDATE items SET id = 9000 WHERE id = 10", "UPDATE items SET id = id + 10000 WHERE id BETWEEN 20 AND 29",
          "INSERT INTO items (id, name) VALUES (10, 'back at 10')", "UPDATE items SET name = 'x' WHERE id = 6000"])
    # a batch Spark merges, on top of the vectors written here (a key change of a row with an unchanged TOAST
    # value), then this process again on top of Spark's
    both(["UPDATE items SET id = 7000 WHERE id = 3", "DELETE FROM hist WHERE a = 1"], here=False)
    assert next(delta_log.commits(ours)).engine != ENGINE
    both(["UPDATE items SET name = 'after spark' WHERE id IN (7000, 4, 11, 12)", "DELETE FROM items WHERE id = 13",
          "INSERT INTO hist VALUES (102, 'after spark')"])
    # from a checkpoint (delta-rs's, with each file's vector) and the commits after it
    deltalake.DeltaTable(ours).create_checkpoint()
    assert delta_log.snapshot(ours).files == files_of(ours)
    # every row of a file deleted: the file is removed, not given a vector
    before = set(delta_log.snapshot(ours).files)
    both(["INSERT INTO items (id, name) SELECT g, 'eight' FROM generate_series(8000, 8009) g"])
    (added,) = set(delta_log.snapshot(ours).files) - before
    both(["DELETE FROM items WHERE id BETWEEN 8000 AND 8009"])
    assert added not in delta_log.snapshot(ours).files
    assert next(delta_log.commits(ours)).metrics["numTargetFilesRemoved"] == 1
    # version 10: the commit written here is followed by a checkpoint, as Spark's would be; each state recorded
    paths = LakePaths.of(str(tmp_path / f"lake_{IN_PROCESS}"), IN_PROCESS)
    ends = []
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA recorded")  # (not published: recording adds nothing to the stream)
    for n in (1, 2, 3):
        with psycopg.connect(pg_db) as conn:  # one transaction (the last is undone below)
            for statement in (f"UPDATE items SET n = {n} WHERE id IN (1, 2, {n * 1000})",
                              f"DELETE FROM items WHERE id = {500 + n}", f"INSERT INTO hist VALUES ({n}, 'step')"):
                conn.execute(statement)
            xid = int(conn.execute("SELECT txid_current() % 4294967296").fetchone()[0])
        in_process_only([])
        ends.append(delta_log.stage_end(paths.changes, "decode"))
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in ("items", "hist"):
                conn.execute(f"CREATE TABLE recorded.{t}_{n} AS SELECT * FROM {t}")
    log_dir = Path(ours) / "_delta_log"
    assert (log_dir / f"{10:020d}.checkpoint.parquet").exists(), sorted(p.name for p in log_dir.iterdir())
    assert next(delta_log.commits(ours)).engine == ENGINE

    # replays and recoveries read gold with its vectors in this process (recover/replay_in_process.py): the state
    # at the base without the rows the vectors delete, copied without vectors, the batches merged into the copy
    def run(*args: str) -> str:
        out = slotlake(cfg, *args, server=False)
        assert out.returncode == 0, out.stderr[-3000:]
        assert launched_apps(out.stderr) == [] and "in this process" in out.stderr, out.stderr[-3000:]
        return out.stderr

    dest = tmp_path / "replayed"
    run("replay", IN_PROCESS, "--from", str(ends[0]), "--to", str(ends[2]), "--dest", str(dest))
    for t in ("items", "hist"):
        assert_gold_equals_pg(str(dest / "public" / t), pg_db, f"recorded.{t}_3")
        assert not deletion_vectors(str(dest / "public" / t))
    run("recover", IN_PROCESS, "--as-of", str(ends[1]), "--table", TABLE, "--table", FULL,
        "--to", str(tmp_path / "recovered"))
    for t in ("items", "hist"):
        assert_gold_equals_pg(str(tmp_path / "recovered" / "public" / t), pg_db, f"recorded.{t}_2")
    # in place: each gold table overwritten in one commit written here (delta-rs does not write a table with
    # vectors), its vectors still on; then syncs go on from it, here and through Spark
    before = {t: next(delta_log.commits(gold(tmp_path, IN_PROCESS, t))).version for t in (TABLE, FULL)}
    run("replay", IN_PROCESS, "--from", str(ends[0]), "--to", str(ends[2]))
    for t in (TABLE, FULL):
        path = gold(tmp_path, IN_PROCESS, t)
        assert_gold_equals_pg(path, pg_db, t)
        newest = next(delta_log.commits(path))
        assert (newest.version, newest.engine, newest.operation) == (before[t] + 1, ENGINE, "WRITE"), newest
        assert newest.end_lsn == str(ends[2]) and "replay" in (newest.slotlake or {}), newest
        assert deletion_vectors(path) and not any(a.get("deletionVector")
                                                  for a in delta_log.snapshot(path).files.values())
    # undo of the last step's transaction (recover/undo_in_process.py): its script brings PostgreSQL back to the
    # state recorded before it
    script = tmp_path / "undo.sql"
    assert f"transaction {xid}" in run("undo", IN_PROCESS, "--xid", str(xid), "--out", str(script)) + \
        script.read_text()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(script.read_text())
        for t in ("items", "hist"):
            for a, b in ((t, f"recorded.{t}_2"), (f"recorded.{t}_2", t)):
                assert conn.execute(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x").fetchone()[0] == 0
    sync_ok(cfg, IN_PROCESS)  # (the undo deletes a FULL-identity row of hist: Spark's MERGE, on top of the overwrite)
    for t in (TABLE, FULL):
        assert_gold_equals_pg(gold(tmp_path, IN_PROCESS, t), pg_db, t)
    in_process_only(["UPDATE items SET name = 'after the replay' WHERE id IN (1, 4000)",
                     "DELETE FROM items WHERE id = 2"])
    assert any(a.get("deletionVector") for a in delta_log.snapshot(ours).files.values())

    # `slotlake optimize` (merge/optimize.py) folds each table's files and vectors into new files, in this process,
    # one OPTIMIZE commit that changes no data: on this lake (vectors written here and by Spark's MERGE) and on the
    # Spark-only one (Spark's vectors); the watermarks stay, syncs go on from it in both ways, a recovery still reads
    # the history before it
    sync_ok(spark_cfg, SPARK)  # (the Spark-only lake has not synced since the recorded steps)
    for source, config in ((IN_PROCESS, cfg), (SPARK, spark_cfg)):
        path = gold(tmp_path, source)
        mark, files = delta_log.latest_slotlake_commit(path), delta_log.snapshot(path).files
        assert any(a.get("deletionVector") for a in files.values()) and len(files) > 1, files
        out = slotlake(config, "optimize", source, "--json", server=False)
        assert out.returncode == 0 and launched_apps(out.stderr) == [], out.stderr[-3000:]
        done = {t["table"]: t for t in json.loads(out.stdout)}
        assert set(done) == {TABLE, FULL}, done
        assert done[TABLE]["files_removed"] == len(files) and done[TABLE]["files_added"] == 1, done
        assert done[TABLE]["vectors_removed"] == sum(1 for a in files.values() if a.get("deletionVector")), done
        after = delta_log.snapshot(path)
        assert len(after.files) == 1 and not any(a.get("deletionVector") for a in after.files.values())
        assert next(delta_log.commits(path)).operation == "OPTIMIZE"
        assert delta_log.latest_slotlake_commit(path) == mark  # the watermark: the same commit
        assert_gold_equals_pg(path, pg_db, TABLE)
        assert_gold_equals_pg(gold(tmp_path, source, FULL), pg_db, FULL)
    assert rows(ours) == rows(theirs)
    both(["UPDATE items SET name = 'after optimize' WHERE id IN (1, 4000, 5000)", "DELETE FROM items WHERE id = 6",
          "INSERT INTO hist VALUES (103, 'after optimize')"])
    assert any(a.get("deletionVector") for a in delta_log.snapshot(ours).files.values())
    run("recover", IN_PROCESS, "--as-of", str(ends[1]), "--table", TABLE, "--to", str(tmp_path / "again"))
    assert_gold_equals_pg(str(tmp_path / "again" / "public" / "items"), pg_db, "recorded.items_2")

"""Benchmark: the decode of bronze rows in process (no Spark), row decoder vs BatchDecoder, on pgbench frames.

    .venv/bin/python bench/decode.py                          # 10,000 tpcb-like transactions, x10 = ~600 k messages
    .venv/bin/python bench/decode.py --txns 2000 --copies 5   # shorter
    .venv/bin/python bench/decode.py --profile                # plus a cProfile of each decoder

Starts a throw-away LocalPostgres, `pgbench -i` (pgbench_history gets REPLICA IDENTITY FULL, as in bench/e2e.py),
a publication and a slot, then `pgbench -n -c 1 -t TXNS` (each transaction = 3 UPDATEs + 1 INSERT = 4 row changes +
Begin + Commit + the Relation messages of the session) and peeks the frames with the extract's options. The frames
are replicated `--copies` times, one bronze file per copy (every copy starts with its Relation messages, like a
new decoding session), and cut into Arrow batches of `--batch-rows` rows (default: what a decode task reads,
`_BRONZE_BATCH_ROWS`). Then, best of `--repeat` runs each:
  row     what decode_partition did before BatchDecoder: to_pydict, ChangeStreamDecoder.feed per row, row_of,
          pa.array per column for batches of 8,192 rows; then the commit end LSNs filled as the task fills them
          today (`CommitEnds`; the row decoder leaves them NULL)
  batch   decode.job.decode_partition (BatchDecoder, batches of at most 8,192 rows)
Both outputs are checked equal. messages/s = bronze rows / s; changes/s = change rows (I/U/D/T) / s.
Then `write`: the decode task's other half, `silver_write.write_task` writing the batch output as silver's Parquet
files into a temporary folder (best of at least 5); `task`: the whole decode task as the job runs it (the copies
written as bronze Parquet files, read in batches of `--batch-rows`, decoded, written as silver), its CPU time.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support
sys.path.insert(0, str(ROOT / "tests"))

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pgframes import Capture
from slotlake import contracts
from slotlake.config import ExtractSettings
from slotlake.decode.commit_ends import CommitEnds
from slotlake.decode.decoded import KIND_CHANGE, decoded_schema, row_of, rows_to_batch
from slotlake.decode.frames import BronzeRow, ChangeStreamDecoder
from slotlake.decode.job import _BRONZE_BATCH_ROWS, _ROWS_PER_FILE, _read_bronze_files, decode_partition
from slotlake.decode.silver_write import write_task
from slotlake.lsn import Lsn
from slotlake_dev.localpg import LocalPostgres
from slotlake_dev.pgbench import pgbench, pgbench_db

OUT_BATCH_ROWS = 8192


def capture(txns: int) -> pa.Table:
    """The frames of `txns` tpcb-like transactions (one bronze file's columns, without `file`)."""
    with LocalPostgres() as pg:
        cap = Capture(pgbench_db(pg, 1))
        try:
            pgbench(pg, "-n", "-c", "1", "-t", str(txns))
            frames = cap.peek()
        finally:
            cap.close()
    return pa.table({
        "lsn": pa.array([Lsn.parse(f.lsn).value for f in frames], pa.int64()),
        "xid": pa.array([f.xid for f in frames], pa.int64()),
        "data": pa.array([f.data for f in frames], pa.binary()),
        "ord": pa.array(range(len(frames)), pa.int64()),
    })


def bronze_batches(frames: pa.Table, copies: int, batch_rows: int) -> list[pa.RecordBatch]:
    files = [frames.append_column("file", pa.array([f"{k:06d}.parquet"] * frames.num_rows)) for k in range(copies)]
    return pa.concat_tables(files).combine_chunks().to_batches(max_chunksize=batch_rows)


def by_row(batches: list[pa.RecordBatch]):
    """The decode_partition of before BatchDecoder, line for line, then today's commit end fill (`CommitEnds`: the
    row decoder leaves `commit_end_lsn` NULL; the task fills it in the same pass, for both decoders alike)."""
    ends = CommitEnds()
    for batch in _rows_decoded(batches):
        yield from ends.feed(batch)
    yield from ends.finish()


def _rows_decoded(batches: list[pa.RecordBatch]):
    schema = decoded_schema()
    decoder = ChangeStreamDecoder()
    out: list[tuple] = []
    last = None
    for batch in batches:
        d = batch.to_pydict()
        for lsn, xid, data, ord_, file in zip(d["lsn"], d["xid"], d["data"], d["ord"], d["file"]):
            last = BronzeRow(lsn, xid, data, ord_, file)
            for item in decoder.feed(last):
                out.append(row_of(item))
                if len(out) >= OUT_BATCH_ROWS:
                    yield rows_to_batch(out, schema)
                    out = []
    decoder.finish(last)
    if out:
        yield rows_to_batch(out, schema)


def by_batch(batches: list[pa.RecordBatch]):
    return decode_partition(iter(batches))


def timed(decode, batches: list[pa.RecordBatch], repeat: int) -> tuple[float, pa.Table]:
    best, table = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = list(decode(batches))
        best = min(best, time.perf_counter() - t)
        table = pa.Table.from_batches(out, schema=decoded_schema())
    return best, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txns", type=int, default=10_000, help="pgbench -t (tpcb-like transactions captured)")
    ap.add_argument("--copies", type=int, default=10, help="bronze files made of the captured frames")
    ap.add_argument("--repeat", type=int, default=3, help="runs per decoder (the best is reported)")
    ap.add_argument("--batch-rows", type=int, default=_BRONZE_BATCH_ROWS,
                    help=f"bronze rows per Arrow batch, as a decode task reads them (default {_BRONZE_BATCH_ROWS:,})")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each decoder")
    args = ap.parse_args()

    t = time.perf_counter()
    frames = capture(args.txns)
    print(f"captured {frames.num_rows:,} frames of {args.txns:,} pgbench transactions in "
          f"{time.perf_counter() - t:.1f}s", flush=True)
    batches = bronze_batches(frames, args.copies, args.batch_rows)
    messages = sum(b.num_rows for b in batches)
    mb = sum(b.column("data").nbytes for b in batches) / 1e6
    print(f"bronze: {messages:,} messages ({mb:.1f} MB) in {args.copies} files, {len(batches)} batches; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)

    row_s, row_table = timed(by_row, batches, args.repeat)
    batch_s, batch_table = timed(by_batch, batches, args.repeat)
    assert batch_table.equals(row_table), "BatchDecoder's output differs from the row decoder's"
    changes = pc.sum(pc.equal(batch_table.column("kind"), KIND_CHANGE)).as_py()
    for name, secs in (("row", row_s), ("batch", batch_s)):
        print(f"{name:>6}: {secs:6.2f}s  {messages / secs:>11,.0f} messages/s  {changes / secs:>11,.0f} changes/s")
    print(f"speed-up: {row_s / batch_s:.1f}x ({changes:,} changes, {batch_table.num_rows:,} decoded rows, "
          f"equal output; load average {os.getloadavg()[0]:.1f})")
    # The task's other half: the silver Parquet files written from the decoded rows (decode/silver_write.py)
    decoded = list(by_batch(batches))
    write_s = float("inf")
    for _ in range(max(args.repeat, 5)):
        with tempfile.TemporaryDirectory(prefix="slotlake-bench-silver-") as folder:
            t = time.perf_counter()
            files = list(write_task(iter(decoded), decode=lambda b: b, folder=folder, rows_per_file=_ROWS_PER_FILE))
            write_s = min(write_s, time.perf_counter() - t)
    nfiles = sum(b.num_rows for b in files)
    print(f" write: {write_s:6.2f}s  {changes / write_s:>11,.0f} changes/s   silver files of the batch output "
          f"({nfiles} files; best of {max(args.repeat, 5)}); decode + write {batch_s + write_s:.2f}s = "
          f"{changes / (batch_s + write_s):,.0f} changes/s per core")
    # The whole task as the decode job runs it: bronze Parquet files (row groups of the extract's batch_rows) read
    # in batches of --batch-rows, decoded and written as silver files (`decode.job._read_bronze_files`), CPU seconds
    task_s = float("inf")
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-bronze-") as bronze:
        paths = []
        for k in range(args.copies):
            paths.append(os.path.join(bronze, f"{k:06d}.parquet"))
            pq.write_table(frames.cast(contracts.arrow_schema(contracts.BRONZE)), paths[-1],
                           row_group_size=ExtractSettings().batch_rows)
        ids = pa.RecordBatch.from_pydict({"id": pa.array(range(len(paths)), pa.int64())})
        for _ in range(max(args.repeat, 5)):
            with tempfile.TemporaryDirectory(prefix="slotlake-bench-silver-") as folder:
                task = partial(write_task, folder=folder, rows_per_file=_ROWS_PER_FILE, decode=decode_partition)
                t = time.process_time()
                list(_read_bronze_files(iter([ids]), paths=paths, task=task, batch_rows=args.batch_rows))
                task_s = min(task_s, time.process_time() - t)
    print(f"  task: {task_s:6.2f}s  {changes / task_s:>11,.0f} changes/s   CPU time of the decode task over the "
          f"{args.copies} bronze files (read, decode, write; batches of {args.batch_rows:,} rows)")
    if args.profile:
        for name, decode in (("row", by_row), ("batch", by_batch)):
            prof = cProfile.Profile()
            prof.runcall(lambda decode=decode: list(decode(batches)))
            print(f"\n---- cProfile: {name} ----")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()

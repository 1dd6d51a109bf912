"""Give every decoded row its transaction's commit end LSN inside the decode task. Pure: numpy + pyarrow.

Silver selects changes after a watermark by `commit_end_lsn` (docs/internals.md "Silver changes"), but a change
comes before its transaction's Commit in the stream, so the decoder cannot know it when it emits the row. A bronze
file holds whole transactions and is decoded in order by one task, so the task holds each transaction's decoded
rows until its Commit row and writes the end LSN into them: no join of the changes with the commits afterwards
(a shuffle of every change). A transaction bigger than `max_held_rows` is let through as it comes (memory stays
bounded), its rows filled from `known_ends`: the end LSNs the decode job read beforehand from the Commit frames of
the transactions big enough to need them (`decode.job`). A row that would leave without its end is an error.

`InFileOrder` checks what this relies on: the rows of each bronze file arrive in `ord` order.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotlake.decode.decoded import KIND_COMMIT
from slotlake.errors import DecodeError
from slotlake.lsn import Lsn

MAX_HELD_ROWS = 1_000_000  # decoded rows of one transaction held back at most (a few hundred MB at worst)


class CommitEnds:
    """Feed decoded batches in stream order; get them back, the same rows in the same order, with
    `commit_end_lsn` set on every row of a transaction. Call `finish()` at the end.

    `known_ends` maps commit LSN -> commit end LSN for the transactions that may outgrow `max_held_rows`; one that
    outgrows it without being there raises DecodeError (it would leave rows without their end)."""

    def __init__(self, max_held_rows: int = MAX_HELD_ROWS, known_ends: Mapping[int, int] | None = None) -> None:
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0
        self._max = max_held_rows
        self._known = dict(known_ends or {})
        self._passing = False  # the open transaction outgrew the limit: its rows go out filled from known_ends

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        if not batch.num_rows:
            return
        commits = np.flatnonzero(pc.equal(batch.column("kind"), KIND_COMMIT).to_numpy(zero_copy_only=False))
        if not len(commits):
            yield from self._hold(batch)
            return
        last = int(commits[-1]) + 1
        if self._passing:  # the rest of the big transaction, up to its Commit, goes out filled from known_ends
            first = int(commits[0]) + 1
            yield self._from_known(batch.slice(0, first))
            self._passing = False
            if first < last:
                yield _filled(batch.slice(first, last - first))
        else:
            held, self._held, self._held_rows = self._held, [], 0
            yield _filled(pa.Table.from_batches([*held, batch.slice(0, last)]).combine_chunks().to_batches()[0]
                          if held else batch.slice(0, last))
        if last < batch.num_rows:
            yield from self._hold(batch.slice(last))

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Rows after the last Commit (none in a well-formed file: the decoder raises first), unfilled."""
        held, self._held, self._held_rows = self._held, [], 0
        yield from held

    def _hold(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        if self._passing:
            yield self._from_known(batch)
            return
        self._held.append(batch)
        self._held_rows += batch.num_rows
        if self._held_rows > self._max:
            held, self._held, self._held_rows = self._held, [], 0
            self._passing = True
            for b in held:
                yield self._from_known(b)

    def _from_known(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` (rows of a transaction let through) with the end LSNs of `known_ends`."""
        ends, lsns = batch.column("commit_end_lsn"), batch.column("commit_lsn")
        need = pc.and_(pc.is_null(ends), pc.is_valid(lsns))
        if not pc.any(need).as_py():
            return batch
        wanted = pc.unique(pc.filter(lsns, need)).to_pylist()
        missing = [w for w in wanted if w not in self._known]
        if missing:
            raise DecodeError(f"the transaction with commit LSN {Lsn(missing[0])} has more than {self._max} decoded "
                              "rows and the decode task was not given its commit end LSN; this is a bug: report it "
                              "with the bronze file")
        keys = pa.array(wanted, pa.int64())
        values = pa.array([self._known[w] for w in wanted], pa.int64())
        filled = pc.if_else(need, values.take(pc.index_in(lsns, value_set=keys)), ends)
        i = batch.schema.get_field_index("commit_end_lsn")
        return batch.set_column(i, batch.schema.field(i), filled)


def _filled(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` ends with a Commit row: each row gets the end LSN of the first Commit at or after it, when that
    Commit is its transaction's (same commit LSN); other rows keep what they had."""
    kind = batch.column("kind")
    commits = np.flatnonzero(pc.equal(kind, KIND_COMMIT).to_numpy(zero_copy_only=False))
    ends = batch.column("commit_end_lsn")
    lsns = batch.column("commit_lsn")
    nxt = np.searchsorted(commits, np.arange(batch.num_rows), side="left")
    commit_lsn = lsns.take(pa.array(commits[nxt]))
    commit_end = ends.take(pa.array(commits[nxt]))
    same = pc.fill_null(pc.equal(lsns, commit_lsn), False)
    filled = pc.if_else(pc.and_(same, pc.is_null(ends)), commit_end, ends)
    i = batch.schema.get_field_index("commit_end_lsn")
    return batch.set_column(i, batch.schema.field(i), filled)


class InFileOrder:
    """Raises DecodeError unless the rows of each file come in increasing `ord` (the order they were pulled)."""

    def __init__(self) -> None:
        self._file: str | None = None
        self._ord = -1

    def check(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if not n:
            return
        files = batch.column("file")
        ords = batch.column("ord").to_numpy(zero_copy_only=False)
        same = np.ones(n, dtype=bool)
        same[0] = files[0].as_py() == self._file
        if n > 1:
            same[1:] = pc.equal(files.slice(1), files.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        prev = np.empty(n, dtype=np.int64)
        prev[0] = self._ord
        prev[1:] = ords[:-1]
        bad = np.flatnonzero(same & (ords <= prev))
        if len(bad):
            k = int(bad[0])
            raise DecodeError(f"bronze file {files[k].as_py()}: row ord {int(ords[k])} came after ord {int(prev[k])}; "
                              "the decode reads each file in order, so this is a bug or a damaged file: report it "
                              "with the file")
        self._file, self._ord = files[n - 1].as_py(), int(ords[-1])

"""Decode whole Arrow batches of bronze rows into decoded rows (`decoded.decoded_schema()`). Pure: numpy + pyarrow.

The output is the reference decoder's (`frames.ChangeStreamDecoder` then `decoded.row_of`), row for row and in
the same order, computed on whole columns instead of per-row Python objects:

- a frame's message type is its first byte; Begin and Commit fields sit at fixed offsets (numpy gathers of
  big-endian ints from the binary column's value buffer, no copy of the frames);
- each row's transaction (Begin fields, `seq`) comes from a forward fill of Begin positions, carried across
  batches in the shared state;
- Insert/Update/Delete tuples are parsed one column position at a time for all rows at once; the text values are
  cut out of the value buffer by one Arrow `take` and UTF-8-checked by one cast.

Runs of Begin/Commit/Insert/Update/Delete of one file take that path. The first row of each file and every other
message (Relation, Type, Truncate, logical Message, Origin, empty or unknown frames) go through the reference
decoder, which keeps the state both paths share (relations of the file, open transaction, seq, the relations
already emitted). A run the fast path finds anything odd in (short or long frames, binary or unknown values,
unchanged TOAST in an old tuple, invalid UTF-8, a change before its Relation, a Commit not matching its Begin,
...) is decoded again by the reference decoder from the same state: errors are exactly its DecodeErrors.
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotlake.decode.decoded import (
    KIND_CHANGE,
    KIND_COMMIT,
    decoded_schema,
    row_of,
    rows_to_batch,
)
from slotlake.decode.frames import BronzeRow, ChangeStreamDecoder
from slotlake.decode.messages import Begin
from slotlake.decode.pgoutput import PG_EPOCH_UNIX_US
from slotlake.lsn import Lsn

_B, _C, _I, _U, _D = b"BCIUD"
_K, _O, _N = b"KON"
_TEXT, _NULL, _TOAST = b"tnu"
_BEGIN_SIZE = 21  # 'B', final_lsn u64, commit ts i64, xid u32
_COMMIT_SIZE = 26  # 'C', flags u8, commit_lsn u64, end_lsn u64, commit ts i64
_FAST_TYPES = np.zeros(256, dtype=bool)
_FAST_TYPES[[_B, _C, _I, _U, _D]] = True
_OPS = pa.array(["I", "U", "D"])
_OLD_KINDS = pa.array(["K", "O"])
_KINDS = pa.array([KIND_CHANGE, KIND_COMMIT])
# Spark sends `data` as binary, or large_binary with spark.sql.execution.arrow.useLargeVarTypes.
_OFFSET_TYPES = {pa.binary(): np.int32, pa.large_binary(): np.int64}


class _Odd(Exception):
    """The fast path met something it leaves to the reference decoder (which decodes it or raises)."""


def _be(values: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian ints of `width` bytes at byte positions `pos` (bounds checked by the caller), as int64."""
    if not len(pos):
        return np.zeros(0, dtype=np.int64)
    return values[pos[:, None] + np.arange(width)].view(dtype).ravel().astype(np.int64)


def _check(ok: np.ndarray | np.bool_ | bool) -> None:
    if not np.all(ok):
        raise _Odd


class _Tuples:
    """The tuple data of m frames, parsed column position by column position for all frames at once.

    Values are flattened row-major (`offsets[r]` .. `offsets[r+1]` are row r's); `start`/`length` locate text
    values in the value buffer, `kind` is the value kind byte ('t', 'n' or 'u'); `end` is where each tuple ends.
    """

    def __init__(self, values: np.ndarray, pos: np.ndarray, end: np.ndarray) -> None:
        _check(pos + 2 <= end)
        ncols = _be(values, pos, 2, ">i2")
        _check(ncols >= 0)
        pos = pos + 2
        self.offsets = np.zeros(len(pos) + 1, dtype=np.int64)
        np.cumsum(ncols, out=self.offsets[1:])
        total = int(self.offsets[-1])
        self.kind = np.empty(total, dtype=np.uint8)
        self.start = np.empty(total, dtype=np.int64)
        self.length = np.zeros(total, dtype=np.int64)
        uniform = len(ncols) and bool(np.all(ncols == ncols[0]))
        every = np.arange(len(pos))
        for j in range(int(ncols.max()) if len(ncols) else 0):
            rows = every if uniform else np.flatnonzero(ncols > j)
            p, e = pos[rows], end[rows]
            _check(p < e)
            k = values[p]
            text = k == _TEXT
            _check(text | (k == _NULL) | (k == _TOAST))
            n = np.zeros(len(p), dtype=np.int64)
            if text.any():
                tp, te = p[text], e[text]
                _check(tp + 5 <= te)
                tn = _be(values, tp + 1, 4, ">i4")
                _check((tn >= 0) & (tp + 5 + tn <= te))
                n[text] = tn + 4
            at = self.offsets[rows] + j
            self.kind[at] = k
            self.start[at] = p + np.where(text, 5, 1)
            self.length[at] = np.where(text, n - 4, 0)
            pos[rows] = p + 1 + n
        self.ncols = ncols
        self.end = pos

    def texts(self, data: pa.Buffer) -> pa.Array:
        """All values as one string array (NULL for 'n' and 'u'); raises _Odd on invalid UTF-8."""
        total = len(self.kind)
        if not total:
            return pa.array([], pa.string())
        # Value k is element 2k of a binary array laid over the frames' buffer (odd elements: the bytes in
        # between); one take copies the values out. Positions only grow, as Arrow offsets must.
        small = data.size < 2**31
        bounds = np.empty(2 * total, dtype=np.int32 if small else np.int64)
        bounds[0::2] = self.start
        bounds[1::2] = self.start + self.length
        laid = pa.Array.from_buffers(pa.binary() if small else pa.large_binary(), 2 * total - 1,
                                     [None, pa.py_buffer(bounds), data])
        taken = laid.take(pa.array(np.arange(0, 2 * total, 2, dtype=np.int32)))
        try:
            text = taken.cast(pa.string())
        except pa.ArrowInvalid:
            raise _Odd from None
        valid = self.kind == _TEXT
        if valid.all():
            return text
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(pa.string(), total, [bitmap, text.buffers()[1], text.buffers()[2]],
                                     offset=text.offset)


def _lists(values: pa.Array, counts: np.ndarray, present: np.ndarray) -> pa.Array:
    """A list array of `counts[r]` consecutive `values` per row, NULL where not `present`."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(np.where(present, counts, 0), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~present))


def _rows_per_value(t: _Tuples) -> np.ndarray:
    return np.repeat(np.arange(len(t.ncols)), t.ncols)


class BatchDecoder:
    """Feed bronze batches (`lsn, xid, data, ord, file`, in (file, ord) order) with `feed`; it yields decoded
    batches in `decoded_schema()`. Call `finish()` after the last batch. One instance per task."""

    def __init__(self) -> None:
        self._rows = ChangeStreamDecoder()  # the reference decoder, and the state both paths share
        self._last: BronzeRow | None = None
        self._schema = decoded_schema()
        self.rows_by_reference = 0  # bronze rows the reference decoder took (rare messages, odd runs): for tests

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        n = batch.num_rows
        if not n:
            return
        data = batch.column("data")
        width = _OFFSET_TYPES.get(data.type)
        if data.null_count or width is None:
            yield from self._by_row(batch, 0, n)  # not what bronze holds: the reference decides
            return
        buffer = data.buffers()[2] or pa.py_buffer(b"")
        values = np.frombuffer(buffer, dtype=np.uint8)
        offsets = np.frombuffer(data.buffers()[1], dtype=width)[data.offset:data.offset + n + 1].astype(np.int64)
        starts, ends = offsets[:-1], offsets[1:]
        types = np.zeros(n, dtype=np.uint8)
        nonempty = ends > starts
        types[nonempty] = values[starts[nonempty]]
        slow = ~_FAST_TYPES[types]
        files = batch.column("file")
        if n > 1:
            slow[1:] |= pc.not_equal(files.slice(1), files.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        slow[0] |= files[0].as_py() != self._rows._file  # the first row of a file resets the relations
        bounds = [0, *(np.flatnonzero(slow[1:] != slow[:-1]) + 1).tolist(), n]
        for a, b in pairwise(bounds):  # alternating runs of slow and fast rows
            if slow[a]:
                yield from self._by_row(batch, a, b)
            else:
                yield from self._run(batch, values, buffer, starts, ends, types, a, b)
        self._last = self._bronze_rows(batch, n - 1, n)[0]

    def finish(self) -> None:
        """A stream may not end inside a transaction (the reference decoder's check)."""
        self._rows.finish(self._last)

    # ---- the reference path ----

    @staticmethod
    def _bronze_rows(batch: pa.RecordBatch, a: int, b: int) -> list[BronzeRow]:
        part = batch.slice(a, b - a)
        cols = [part.column(c).to_pylist() for c in ("lsn", "xid", "data", "ord", "file")]
        return [BronzeRow(*r) for r in zip(*cols)]

    def _by_row(self, batch: pa.RecordBatch, a: int, b: int) -> Iterator[pa.RecordBatch]:
        self.rows_by_reference += b - a
        out = [row_of(item) for row in self._bronze_rows(batch, a, b) for item in self._rows.feed(row)]
        if out:
            yield rows_to_batch(out, self._schema)

    # ---- the fast path ----

    def _run(self, batch, values, buffer, starts, ends, types, a: int, b: int) -> Iterator[pa.RecordBatch]:
        try:
            out, begin, seq = self._decode_run(batch, values, buffer, starts[a:b], ends[a:b], types[a:b], a, b)
        except _Odd:
            yield from self._by_row(batch, a, b)
            return
        self._rows._begin, self._rows._seq = begin, seq
        if out.num_rows:
            yield out

    def _decode_run(self, batch, values, buffer, s, e, t, a, b) -> tuple[pa.RecordBatch, Begin | None, int]:
        state = self._rows
        m = len(t)
        size = e - s
        is_b, is_c = t == _B, t == _C
        is_x = ~(is_b | is_c)
        _check(size[is_b] == _BEGIN_SIZE)
        _check(size[is_c] == _COMMIT_SIZE)
        # Transactions: B and C alternate, changes only inside one.
        opened = state._begin is not None
        marks = np.flatnonzero(is_b | is_c)
        expected = np.where((np.arange(len(marks)) % 2 == 0) == opened, _C, _B)
        _check(t[marks] == expected)
        last_mark = np.maximum.accumulate(np.where(is_b | is_c, np.arange(m), -1))
        inside = np.where(last_mark >= 0, t[np.maximum(last_mark, 0)] == _B, opened)
        _check(inside[is_x])
        # Begin fields per row: index 0 is the transaction open before this run, k the run's k-th Begin.
        bpos = s[is_b]
        carried = state._begin
        b_lsn = np.concatenate([[carried.final_lsn.value if carried else 0], _be(values, bpos + 1, 8, ">u8")])
        b_ts = np.concatenate([[carried.commit_ts_us if carried else 0], _be(values, bpos + 9, 8, ">i8")])
        b_xid = np.concatenate([[carried.xid if carried else 0], _be(values, bpos + 17, 4, ">u4")])
        txn = np.cumsum(is_b)
        cpos = s[is_c]
        c_lsn = _be(values, cpos + 2, 8, ">u8")
        c_end = _be(values, cpos + 10, 8, ">u8")
        _check(c_lsn == b_lsn[txn[is_c]])
        # seq: changes since the row's Begin (or since the run start, plus the carried count).
        nx = np.cumsum(is_x)
        b_rows = np.flatnonzero(is_b)
        base = np.concatenate([[-state._seq], nx[b_rows]])
        seq_all = nx - 1 - base[txn]
        # The state after the run: the open transaction (if any) and its change count, as the reference keeps them.
        begin: Begin | None
        if len(marks) and t[marks[-1]] == _B:
            begin = Begin(final_lsn=Lsn(int(b_lsn[-1])), commit_ts_us=int(b_ts[-1]), xid=int(b_xid[-1]))
        else:
            begin = None if len(marks) else carried
        seq = int(nx[-1] - base[txn[-1]])

        changes = self._changes(values, buffer, s[is_x], e[is_x], t[is_x])

        # Output: one row per non-Begin row, in order; changes and commits filled from their own arrays.
        out_rows = np.flatnonzero(~is_b)
        k = len(out_rows)
        xo = is_x[out_rows]  # output row is a change
        co = ~xo
        txn_o = txn[out_rows]
        i64 = pa.int64()

        def spread(x_values: np.ndarray, dtype=np.int64) -> np.ndarray:
            """Per-change values on the output rows (0 on the commit rows)."""
            full = np.zeros(k, dtype=dtype)
            full[xo] = x_values
            return full

        lsn = batch.column("lsn").slice(a, b - a).to_numpy(zero_copy_only=False)
        commit_end = np.zeros(k, dtype=np.int64)
        commit_end[co] = c_end
        rel_at = pa.array(spread(changes["rel"]), mask=co)
        rels = changes["rels"]
        cols = {
            "kind": _KINDS.take(pa.array(co.astype(np.int8))),
            "commit_lsn": pa.array(b_lsn[txn_o], i64),
            "commit_end_lsn": pa.array(commit_end, i64, mask=xo),
            "commit_ts": pa.array(b_ts[txn_o] + PG_EPOCH_UNIX_US, pa.timestamp("us", tz="UTC"), mask=co),
            "xid": pa.array(b_xid[txn_o], i64),
            "seq": pa.array(seq_all[out_rows].astype(np.int32), pa.int32(), mask=co),
            "lsn": pa.array(lsn[out_rows], i64, mask=co),
            "rel_oid": pa.array(spread(changes["oid"]), i64, mask=co),
            "schema_name": rels["schema_name"].take(rel_at),
            "table_name": rels["table_name"].take(rel_at),
            "op": _OPS.take(pa.array(spread(changes["op"]), mask=co)),
            "replica_identity": rels["replica_identity"].take(rel_at),
            "columns": rels["columns"].take(rel_at),
            "key_columns": rels["key_columns"].take(rel_at),
            "type_oids": rels["type_oids"].take(rel_at),
            "typmods": rels["typmods"].take(rel_at),
            "old_kind": _OLD_KINDS.take(pa.array(spread(changes["old_kind"]),
                                                 mask=~spread(changes["has_old"], bool))),
            "old": _lists(changes["old"], spread(changes["old_n"]), spread(changes["has_old"], bool)),
            "new": _lists(changes["new"], spread(changes["new_n"]), spread(changes["has_new"], bool)),
            "unchanged": _lists(changes["unchanged"], spread(changes["unchanged_n"]), xo),
            "truncate_options": pa.nulls(k, pa.int32()),
            "bronze_file": pa.array([state._file], pa.string()).take(pa.array(np.zeros(k, dtype=np.int8))),
            "content": pa.nulls(k, pa.binary()),
        }
        return pa.RecordBatch.from_arrays(list(cols.values()), schema=self._schema), begin, seq

    def _changes(self, values, buffer, s, e, t) -> dict:
        """Insert/Update/Delete frames, parsed: per change its relation, op, old and new tuples."""
        state = self._rows
        x = len(t)
        _check(s + 6 <= e)  # 'I|U|D', relation oid, first tuple marker
        oid = _be(values, s + 1, 4, ">u4")
        marker = values[s + 5]
        is_i, is_u, is_d = t == _I, t == _U, t == _D
        keyed = (marker == _K) | (marker == _O)
        _check(~is_i | (marker == _N))
        _check(~is_d | keyed)
        _check(~is_u | keyed | (marker == _N))
        has_old = keyed & ~is_i
        has_new = ~is_d
        old = _Tuples(values, s[has_old] + 6, e[has_old])
        _check(old.kind != _TOAST)  # the reference names the error: never a placeholder for an old value
        new_marker = s + 5
        new_marker[has_old] = old.end
        new_marker = new_marker[has_new]
        _check(new_marker < e[has_new])
        _check(values[new_marker] == _N)
        new = _Tuples(values, new_marker + 1, e[has_new])
        tuple_end = np.empty(x, dtype=np.int64)
        tuple_end[has_new] = new.end
        tuple_end[is_d] = old.end[is_d[has_old]]
        _check(tuple_end == e)  # no trailing bytes

        # Relations: the Relation messages of this file seen so far (fixed within a run).
        uniq, rel = np.unique(oid, return_inverse=True)
        described = []
        for o in uniq.tolist():
            r = state._relations.get(o)
            if r is None:
                raise _Odd
            described.append((r, state._described(r)))
        ncols = np.array([len(d[1][0]) for d in described], dtype=np.int64)
        _check(new.ncols == ncols[rel[has_new]])
        s_ = pa.string()
        rels = {
            "schema_name": pa.array([r.schema for r, _ in described], s_),
            "table_name": pa.array([r.name for r, _ in described], s_),
            "replica_identity": pa.array([r.replica_identity.value for r, _ in described], s_),
            "columns": pa.array([list(d[0]) for _, d in described], pa.list_(s_)),
            "key_columns": pa.array([list(d[1]) for _, d in described], pa.list_(s_)),
            "type_oids": pa.array([list(d[2]) for _, d in described], pa.list_(pa.int32())),
            "typmods": pa.array([list(d[3]) for _, d in described], pa.list_(pa.int32())),
        }
        old_n = np.zeros(x, dtype=np.int64)
        old_n[has_old] = old.ncols
        new_n = np.zeros(x, dtype=np.int64)
        new_n[has_new] = new.ncols
        toast = new.kind == _TOAST
        positions = (np.arange(len(new.kind)) - new.offsets[_rows_per_value(new)])[toast]
        unchanged_n = np.zeros(x, dtype=np.int64)
        unchanged_n[has_new] = np.bincount(_rows_per_value(new)[toast], minlength=len(new.ncols))
        return {
            "oid": oid, "rel": rel, "rels": rels,
            "op": np.where(is_i, 0, np.where(is_u, 1, 2)),
            "old_kind": (marker == _O).astype(np.int64), "has_old": has_old, "has_new": has_new,
            "old": old.texts(buffer), "old_n": old_n,
            "new": new.texts(buffer), "new_n": new_n,
            "unchanged": pa.array(positions.astype(np.int32), pa.int32()), "unchanged_n": unchanged_n,
        }

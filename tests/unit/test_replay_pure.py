"""Pure parts of the replay and the bootstrap archive: point parsing, base choice, file selection, arguments."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slotlake.bronze import BronzeFile
from slotlake.decode.job import files_for_range
from slotlake.errors import ConfigError, DecodeError
from slotlake.lsn import Lsn
from slotlake.recover.replay import ReplayRequest, parse_point, request
from slotlake.recover.replay_job import base_at
from slotlake.source.catalog_read import bootstrap_dir, list_bootstrap

pytestmark = pytest.mark.unit
UTC = UTC


@pytest.mark.parametrize("text,want", [
    ("16/B374D848", Lsn.parse("16/B374D848")),
    ("0/0", Lsn(0)),
    ("2024-03-01T09:14:00", datetime(2024, 3, 1, 9, 14, tzinfo=UTC)),
    ("2024-03-01 09:14", datetime(2024, 3, 1, 9, 14, tzinfo=UTC)),
    ("2024-03-01T11:14:00+02:00", datetime(2024, 3, 1, 9, 14, tzinfo=UTC)),
    ("2024-03-01T09:14:00Z", datetime(2024, 3, 1, 9, 14, tzinfo=UTC)),
], ids=["lsn", "zero-lsn", "naive-is-utc", "space-no-seconds", "offset", "zulu"])
def test_parse_point(text, want):
    got = parse_point(text)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("text", ["yesterday", "16/", "G/1", "2024-13-01"], ids=["word", "half-lsn", "hex", "month"])
def test_parse_point_rejects(text):
    with pytest.raises(ConfigError, match="neither an LSN"):
        parse_point(text, "--to")


def test_request_checks_order_and_tables():
    with pytest.raises(ConfigError, match="swap them"):
        request("shop", "0/20", "0/10")
    with pytest.raises(ConfigError, match="schema.table"):
        request("shop", "0/10", "0/20", ["orders"])
    r = request("shop", "0/10", "2024-03-01T10:00:00", ["public.orders", "s.t"], " /tmp/out ")
    assert r == ReplayRequest("shop", Lsn(0x10), datetime(2024, 3, 1, 10, tzinfo=UTC),
                              (("public", "orders"), ("s", "t")), "/tmp/out")
    assert r.args() == ["--from", "0/10", "--to", "2024-03-01T10:00:00+00:00", "--tables", "public.orders,s.t",
                        "--dest", "/tmp/out"]


def test_base_is_the_latest_recorded_end_at_or_before():
    ends = [(Lsn(10), 1), (Lsn(20), 2), (Lsn(20), 3), (Lsn(40), 5)]
    assert base_at(ends, Lsn(9)) is None
    assert base_at(ends, Lsn(10)) == (Lsn(10), 1)
    assert base_at(ends, Lsn(39)) == (Lsn(20), 3)  # two commits at one end: the later version
    assert base_at(ends, Lsn(99)) == (Lsn(40), 5)


def test_files_for_range():
    f = [BronzeFile(f"/b/{i}", Lsn(s), Lsn(e)) for i, (s, e) in enumerate([(0, 10), (10, 20), (25, 30)])]
    assert files_for_range(f, None, Lsn(30)) == f
    assert files_for_range(f, Lsn(10), Lsn(20)) == f[1:2]
    assert files_for_range(f, Lsn(9), Lsn(10)) == f[:2]  # a commit at 10 may open the second file
    assert files_for_range(f, Lsn(20), Lsn(24)) == []
    assert files_for_range(f, Lsn(30), Lsn(40)) == []


def test_list_bootstrap_reads_placed_files_only(tmp_path):
    root = str(tmp_path / "shop")
    folder = Path(bootstrap_dir(root))
    folder.mkdir(parents=True)
    table = {"oid": 1, "schema": "public", "name": "t", "kind": "r", "replica_identity": "d",
             "columns": [{"attnum": 1, "name": "id", "type_oid": 23, "type_name": "integer", "typmod": -1,
                          "not_null": True, "default": None, "generated": "", "identity": "", "is_key": True}]}
    lsn = Lsn.parse("0/1A2B3C")
    (folder / f"{lsn.hex16}.json").write_text(json.dumps({"format": 1, "lsn": str(lsn), "tables": [table]}))
    (folder / f".{lsn.hex16}.json.tmp").write_text("partial")
    (got,) = list_bootstrap(root)
    assert got.lsn == lsn and [t.qualified_name for t in got.tables] == ["public.t"]
    (folder / f"{Lsn(0x1A2B3D).hex16}.json").write_text(json.dumps({"format": 1, "lsn": str(lsn), "tables": []}))
    with pytest.raises(DecodeError, match="does not match its name"):
        list_bootstrap(root)


def test_an_in_place_replay_replaces_whole_silver_files_and_whole_bronze_files():
    """`replay_in_process._whole_files`: (after, to] widened until every silver file lies inside or outside it and
    its end is a bronze file's end; the files inside are the ones replaced."""
    import pytest

    from slotlake.merge.silver_stats import SilverFileStats
    from slotlake.recover.replay_in_process import Declined, _whole_files

    def f(path: str, e_min: int | None, e_max: int | None) -> SilverFileStats:  # (commit end LSNs e_min..e_max)
        return SilverFileStats("public", "public", "t", "t", commit_lsn_min=None, commit_end_lsn_max=e_max,
                               path=path, commit_end_lsn_min=e_min)

    bronze_ends = [100, 200, 300, 400]  # files (0, 100], (100, 200], ...
    # silver files of slices (0, 200] and (200, 400], and one of (200, 300] of another table
    stats = [f("a", 10, 190), f("b", 210, 390), f("c", 220, 290)]
    assert _whole_files(stats, bronze_ends, 200, 400) == (200, 400, ["b", "c"])  # aligned: as asked
    assert _whole_files(stats, bronze_ends, 200, 250) == (200, 400, ["b", "c"])  # to inside b: up to b's file end
    assert _whole_files(stats, bronze_ends, 150, 250) == (9, 400, ["a", "b", "c"])  # after inside a: from a's start
    assert _whole_files(stats, bronze_ends, 0, 50) == (0, 200, ["a"])
    with pytest.raises(Declined, match="past the last decoded bronze file"):
        _whole_files(stats, bronze_ends, 200, 450)
    with pytest.raises(Declined, match="without commit LSN statistics"):
        _whole_files([*stats, f("d", None, 300)], bronze_ends, 200, 400)


def test_an_in_place_replay_merges_silver_up_to_points_no_silver_file_straddles():
    """`replay_in_process._merge_ends`: each merge of an in-place replay ends where no silver file holds changes
    on both sides (by commit LSN and by commit end LSN), about a slice of bronze apart."""
    from slotlake.merge.silver_stats import SilverFileStats
    from slotlake.recover.replay_in_process import _merge_ends

    def f(lsn: tuple[int, int], end: tuple[int, int]) -> SilverFileStats:
        return SilverFileStats("public", "public", "t", "t", commit_lsn_min=lsn[0], commit_end_lsn_max=end[1],
                               commit_lsn_max=lsn[1], commit_end_lsn_min=end[0])

    bronze = [(100, 10, 100), (200, 10, 100), (300, 10, 100), (400, 10, 100)]  # (end LSN, bytes, rows)
    stats = [f((5, 190), (10, 200)), f((205, 390), (220, 400))]  # two sync slices: (0, 200] and (200, 400]
    assert _merge_ends(stats, bronze, 0, 400, 1 << 20, 1_000) == [400]
    assert _merge_ends(stats, bronze, 0, 400, 1 << 20, 250) == [200, 400]  # 300 cuts through the second file
    assert _merge_ends(stats, bronze, 0, 400, 1 << 20, 50) == [200, 400]  # over the budget: the nearest point
    assert _merge_ends(stats, bronze, 0, 400, 25, 1_000) == [200, 400]  # bytes count too
    assert _merge_ends([f((5, 90), (10, 100)), *stats[1:]], bronze, 0, 400, 1 << 20, 150) == [100, 200, 400]
    assert _merge_ends(stats, bronze, 200, 400, 1 << 20, 1_000) == [400]
    assert _merge_ends(stats, bronze, 400, 400, 1 << 20, 1_000) == []


def test_a_replay_writes_silver_files_that_end_where_the_replaced_ones_did():
    """The re-derived silver of an in-place replay is cut at the ends of the files it replaces (runs), so the next
    interval's replay starts at a file's edge (`_split_at`)."""
    from slotlake.recover.replay_in_process import _bronze_end, _split_at

    files = [BronzeFile(f"/b/{i}.parquet", Lsn(i * 10), Lsn(i * 10 + 10)) for i in range(5)]  # ends 10, 20, .., 50
    ends = [10, 20, 30, 40, 50]
    assert _bronze_end(ends, 15) == 20 and _bronze_end(ends, 20) == 20 and _bronze_end(ends, 51) is None
    cuts = {_bronze_end(ends, 12), _bronze_end(ends, 38)}  # two replaced files: commits ending up to 12 and to 38
    assert [[f.end_lsn.value for f in g] for g in _split_at(files, cuts)] == [[10, 20], [30, 40], [50]]
    assert [[f.end_lsn.value for f in g] for g in _split_at(files, set())] == [ends]
    assert _split_at([], {10}) == []

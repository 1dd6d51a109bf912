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

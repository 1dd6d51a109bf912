"""merge/silver_stats.py: which tables silver's files can hold changes of, from their statistics."""
import pytest

from slotlake.merge.silver_stats import SilverFileStats, files_to_read, has_changes, tables_in_window
from slotlake.names import TableName

pytestmark = pytest.mark.unit

ACCOUNTS = TableName("public", "accounts")
HISTORY = TableName("public", "history")


def one_table(t: TableName, lsn_min: int, end_max: int) -> SilverFileStats:
    return SilverFileStats(t.schema, t.schema, t.name, t.name, lsn_min, end_max)


def test_a_table_has_changes_only_where_a_file_of_it_reaches_into_the_window():
    files = [one_table(ACCOUNTS, 100, 200), one_table(HISTORY, 300, 400)]
    # window (after, upto]: by the file's largest commit_end_lsn and smallest commit_lsn
    assert has_changes(files, ACCOUNTS, None, 150)
    assert has_changes(files, ACCOUNTS, 199, 1000)
    assert not has_changes(files, ACCOUNTS, 200, 1000)  # every change ends at or before the watermark
    assert not has_changes(files, HISTORY, None, 299)  # every change commits after the run's end
    assert has_changes(files, HISTORY, None, 300)
    assert not has_changes(files, TableName("public", "branches"), None, 1000)
    assert not has_changes([], ACCOUNTS, None, 1000)


def test_a_file_without_statistics_may_hold_any_table_at_any_lsn():
    bare = SilverFileStats(None, None, None, None, None, None)
    assert has_changes([bare], ACCOUNTS, 10**12, 10**12 + 1)
    assert tables_in_window([bare], None, 10) is None  # cannot name its table: ask Spark


def test_ranges_over_several_tables_are_taken_as_ranges():
    mixed = SilverFileStats("public", "public", "accounts", "history", 100, 200)
    assert has_changes([mixed], TableName("public", "branches"), None, 1000)  # between the bounds: may hold
    assert not has_changes([mixed], TableName("public", "tellers"), None, 1000)  # after the maximum
    assert not has_changes([mixed], TableName("audit", "accounts"), None, 1000)  # another schema
    assert tables_in_window([mixed], None, 1000) is None


def test_cut_string_bounds_are_compared_by_their_prefix():
    # Delta keeps 32 characters of a string statistic and appends U+007F to a cut maximum (seen in its logs).
    long_name = "orders_of_the_northern_region_2026_archive"
    prefix = long_name[:32]
    cut = SilverFileStats("public", "public", prefix, prefix + "\x7f", 1, 2)
    assert has_changes([cut], TableName("public", long_name), None, 10)
    assert has_changes([cut], TableName("public", prefix + "zzz"), None, 10)  # same prefix: may be in the file
    assert has_changes([cut], TableName("public", prefix + "\u00e9"), None, 10)  # above U+007F, same prefix
    assert not has_changes([cut], TableName("public", "zebra"), None, 10)
    assert not has_changes([cut], TableName("public", "aardvark"), None, 10)
    assert tables_in_window([cut], None, 10) is None  # a cut name names no table exactly


def test_the_tables_in_a_window_are_read_off_single_table_files():
    files = [one_table(ACCOUNTS, 100, 200), one_table(HISTORY, 300, 400), one_table(ACCOUNTS, 300, 400)]
    assert tables_in_window(files, None, 1000) == {ACCOUNTS, HISTORY}
    assert tables_in_window(files, 200, 1000) == {ACCOUNTS, HISTORY}
    assert tables_in_window(files, None, 250) == {ACCOUNTS}
    assert tables_in_window(files, 400, 1000) == set()
    # a file out of the window does not spoil the answer, one in it does
    spoiler = SilverFileStats(None, None, None, None, 500, 600)
    assert tables_in_window([*files, spoiler], None, 450) == {ACCOUNTS, HISTORY}
    assert tables_in_window([*files, spoiler], None, 500) is None


def test_the_files_to_read_are_those_that_may_hold_the_table_in_the_window():
    def at(path: str | None, t: TableName, lsn_min: int, end_max: int) -> SilverFileStats:
        return SilverFileStats(t.schema, t.schema, t.name, t.name, lsn_min, end_max, path)

    files = [at("a", ACCOUNTS, 100, 200), at("h", HISTORY, 100, 200), at("b", ACCOUNTS, 300, 400),
             SilverFileStats("public", "public", "accounts", "history", 150, 350, "m")]  # several tables
    assert files_to_read(files, ACCOUNTS, None, 1000) == ["a", "b", "m"]
    assert files_to_read(files, ACCOUNTS, 200, 1000) == ["b", "m"]  # a ends at the watermark
    assert files_to_read(files, ACCOUNTS, None, 120) == ["a"]  # b and m start after the end
    assert files_to_read(files, HISTORY, 350, 1000) == []
    assert files_to_read([*files, at(None, ACCOUNTS, 500, 600)], ACCOUNTS, None, 1000) is None  # no path
    assert files_to_read([*files, at(None, HISTORY, 500, 600)], ACCOUNTS, None, 1000) == ["a", "b", "m"]

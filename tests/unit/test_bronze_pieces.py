"""How a local lake's decode splits its bronze files into pieces for its tasks (decode/job.py `plan_pieces`)."""
from __future__ import annotations

from slotlake.decode.job import plan_pieces


def covers(groups: list[int], pieces: list[tuple[int, int, int]]) -> bool:
    """Each file's row groups, from 0 to its count, one piece after the other, every piece non-empty."""
    for i, g in enumerate(groups):
        mine = [(a, b) for f, a, b in pieces if f == i]
        if [a for a, _ in mine] != [0, *[b for _, b in mine[:-1]]] or mine[-1][1] != g or any(b <= a for a, b in mine):
            return False
    return [f for f, _, _ in pieces] == sorted(f for f, _, _ in pieces)


def test_one_file_is_split_into_about_the_tasks_asked():
    pieces = plan_pieces([10], 4)
    assert pieces == [(0, 0, 2), (0, 2, 5), (0, 5, 8), (0, 8, 10)]
    assert covers([10], pieces)


def test_as_many_files_as_tasks_stay_whole():
    assert plan_pieces([16, 16, 16, 16, 16, 16, 16, 12], 4) == [(i, 0, g) for i, g in
                                                                   enumerate([16, 16, 16, 16, 16, 16, 16, 12])]


def test_a_big_file_next_to_a_small_one_is_split_more():
    groups = [16, 8]
    pieces = plan_pieces(groups, 4)
    assert covers(groups, pieces)
    sizes = [b - a for _, a, b in pieces]
    assert len(pieces) == 5 and max(sizes) <= 6


def test_never_more_pieces_than_row_groups():
    for groups, tasks in (([1], 8), ([3, 1], 100), ([2, 2, 2], 1), ([5], 0)):
        pieces = plan_pieces(groups, tasks)
        assert covers(groups, pieces)
        assert len(pieces) <= sum(groups)

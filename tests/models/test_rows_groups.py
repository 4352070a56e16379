"""Rows' groups: verify windows stacked by width, prompt pieces together (one varlen GDN
call), and split / join as inverses whether a group's rows lie back to back or not."""

import torch

from flashlane.models.rows import Rows


def sessions(n: int) -> list[object]:
    """Stand-ins: grouping reads only whether a piece has a session."""
    return [object() for _ in range(n)]


def test_prompt_pieces_form_one_group_and_windows_stack_by_width():
    s = sessions(5)
    rows = Rows.of(
        [
            (s[0], [5, 6, 7], 0, False),
            (s[1], [1, 2], 4, True),
            (s[2], [9] * 4, 0, False),
            (s[3], [3, 4], 8, True),
            (s[4], [8], 2, True),
        ],
        "cpu",
    )
    names = {id(x): i for i, x in enumerate(s)}
    by = [[names[id(p.session)] for p in g] for g in rows.groups(True, True)]
    assert by == [[0, 2], [1, 3], [4]]
    assert [[names[id(p.session)] for p in g] for g in rows.groups(True)] == [[0], [1, 3], [2], [4]]
    assert len(rows.groups()) == 5


def test_split_join_round_trip_back_to_back_or_apart():
    s = sessions(4)
    for layout in (
        [(s[0], [5, 6, 7], 0, False), (s[1], [9] * 4, 0, False), (s[2], [1, 2], 4, True)],
        [
            (s[0], [5, 6, 7], 0, False),
            (s[2], [1, 2], 4, True),
            (s[1], [9] * 4, 0, False),
            (s[3], [3, 4], 8, True),
        ],
    ):
        rows = Rows.of(layout, "cpu")
        x = torch.arange(len(rows.token_ids) * 3, dtype=torch.float32).view(-1, 3)
        parts = rows.split(x, True, True)
        for g, part in zip(rows.groups(True, True), parts):
            if g[0].recurrent:
                assert part.shape[:2] == (len(g), g[0].length)
            else:
                assert part.shape[:2] == (1, sum(p.length for p in g))
                assert torch.equal(part[0], torch.cat([x[p.rows] for p in g]))
        assert torch.equal(rows.join([p * 1 for p in parts], True, True), x)

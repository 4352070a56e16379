"""A drafted lone call's first guesses (lanes/lone_turn._hint): the drafts a stream held for
its pending token, else its copy drafts, else none."""

from __future__ import annotations

from types import SimpleNamespace

from flashlane.lanes.copy_drafts import CopyIndex
from flashlane.lanes.lone_turn import MAX_HINT, _hint
from flashlane.lanes.stream import Held


def test_hints_are_held_drafts_at_the_pending_token_else_copy_drafts():
    context = [5, 6, 7, 8, 9, 5, 6, 7]  # "5 6 7" repeats: its copy drafts are 8, 9, 5, 6
    s = SimpleNamespace(start=8, copy_index=CopyIndex(context))
    assert _hint(s, Held("mtp", 8, (40, 41), (0.9, 0.8))) == [40, 41]
    copied = s.copy_index.propose(MAX_HINT)
    assert copied and copied[0] == 8
    assert _hint(s, Held("mtp", 7, (40, 41), (0.9, 0.8))) == copied  # stale: another start
    assert _hint(s, None) == copied
    assert _hint(SimpleNamespace(start=8, copy_index=None), None) == []

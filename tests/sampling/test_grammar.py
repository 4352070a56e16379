"""The grammar state of one stream: row masks after a window's tokens, and no trace of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

import flashlane
from flashlane.request import StructuredOutput
from flashlane.sampling.grammar import Grammars

MODEL = Path(flashlane.__file__).parent / "default_model"


def grammars() -> tuple[Grammars, Tokenizer]:
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    return Grammars(tok.to_str(), 8192, [0, 2]), tok


def test_row_masks_follow_the_window_and_roll_back():
    g, tok = grammars()
    state = g.matcher(StructuredOutput(choice=("alpha", "beta")))
    first = state.row_masks([], [17])  # a prompt's last row: the grammar's start
    allowed = {tok.id_to_token(int(i)) for i in np.flatnonzero(first[0])}
    assert allowed and all("alpha".startswith(t) or "beta".startswith(t) for t in allowed)
    a = tok.token_to_id("a") or tok.encode("a").ids[0]
    z = tok.encode("zz").ids[0]
    # row 1 after a refused draft reuses row 0's mask; nothing stays consumed
    masks = state.row_masks([a], [a, z, a])
    assert (masks[1] == masks[0]).all() and (masks[2] == masks[0]).all()
    assert state.num_consumed == 1
    again = state.row_masks([a], [a])
    assert (again[0] == masks[0]).all()
    assert not again[0][0] and not again[0][2]  # "a" alone is not a choice: no end yet


def test_a_finished_grammar_allows_only_the_end():
    g, tok = grammars()
    state = g.matcher(StructuredOutput(regex="ok"))
    ids = tok.encode("ok").ids
    masks = state.row_masks(ids, [ids[-1]])
    assert set(np.flatnonzero(masks[0]).tolist()) == {0, 2}

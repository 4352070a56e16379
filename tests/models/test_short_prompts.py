"""A prompt of up to SHORT_PROMPT tokens runs the recurrent GDN rule (models/layers/
gated_deltanet.py), longer ones and their pieces the chunked rule: each piece by its own
prompt's length, so a short prompt beside others computes as alone; and the two rules agree
to float64 rounding on the same prompt."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import Draws, Window
from flashlane.models.layers import gated_deltanet
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return load_checkpoint(tiny_ckpt, dtype=torch.float64)


def _backend(cfg, model, n):
    sessions = [SessionState.empty(cfg, 256, torch.float64, torch.float64) for _ in range(n)]
    return ModelBackend(model, sessions, max_rows=16, max_prompt_rows=512)


def _piece(sid, prompt, start, end):
    tokens = tuple(prompt[start:end])
    return Window(
        sid, sid, start, tokens, Draws(GREEDY, 0, prompt, []), "prompt", end == len(prompt)
    )


def _rules(model, monkeypatch) -> list[str]:
    """Which rule each GDN call of the next forward takes."""
    seen, k = [], model.kernels
    rec, chunk = k.recurrent_gdn, k.chunk_gdn

    def recurrent(*a, **kw):
        seen.append("recurrent")
        return rec(*a, **kw)

    def chunked(*a, **kw):
        seen.append("chunked")
        return chunk(*a, **kw)

    spied = dataclasses.replace(k, recurrent_gdn=recurrent, chunk_gdn=chunked)
    monkeypatch.setattr(model, "kernels", spied)  # the forward hands its kernels down
    return seen


def _rows(b, windows) -> dict[int, torch.Tensor]:
    b.verify(windows)
    return {w.stream_id: b.fed[w.stream_id].residual.clone() for w in windows}


def test_short_prompts_run_the_recurrent_rule_and_long_ones_the_chunked(model, monkeypatch):
    cfg, m = model
    gdn_layers = cfg.layer_types.count("linear")
    short, long = list(range(5, 5 + 40)), list(range(7, 7 + 100))
    b = _backend(cfg, m, 3)
    seen = _rules(m, monkeypatch)
    b.verify([_piece(0, short, 0, 40)])
    assert seen == ["recurrent"] * gdn_layers
    seen.clear()
    b.verify([_piece(1, long, 0, 64)])  # a long prompt's first piece: not its whole prompt
    assert seen == ["chunked"] * gdn_layers
    seen.clear()
    b.verify([_piece(0, short, 0, 40), _piece(2, long, 0, 64)])
    assert sorted(seen) == sorted(["recurrent", "chunked"] * gdn_layers)


def test_a_short_prompt_beside_a_long_one_computes_as_alone(model):
    cfg, m = model
    short, long = list(range(5, 5 + 40)), list(range(7, 7 + 100))
    b = _backend(cfg, m, 2)
    alone = {**_rows(b, [_piece(0, short, 0, 40)]), **_rows(b, [_piece(1, long, 0, 64)])}
    both = _rows(b, [_piece(0, short, 0, 40), _piece(1, long, 0, 64)])
    for sid in (0, 1):
        torch.testing.assert_close(both[sid], alone[sid], rtol=0, atol=1e-12)


def test_the_two_rules_agree_on_a_short_prompt(model, monkeypatch):
    cfg, m = model
    short = list(range(5, 5 + 40))
    b = _backend(cfg, m, 1)
    recurrent = _rows(b, [_piece(0, short, 0, 40)])[0]
    monkeypatch.setattr(gated_deltanet, "SHORT_PROMPT", 0)  # every prompt chunked
    chunked = _rows(b, [_piece(0, short, 0, 40)])[0]
    assert not torch.equal(recurrent, chunked)  # two rules, two orders of rounding
    torch.testing.assert_close(recurrent, chunked, rtol=0, atol=1e-9)

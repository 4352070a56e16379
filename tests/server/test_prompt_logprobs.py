"""The engine's prompt logprobs (server/engine_thread.AsyncEngine.prompt_logprobs: teacher
forced on a scratch session of the caller's thread): each prompt token's logprob and the top
alternatives, and for an FP8 model its rows computed as prompt rows (kernels/row_kind.py),
as the engine's prompt pieces are."""

import math

import pytest

from flashlane.kernels import row_kind
from flashlane.server import engine_thread
from tests.server.conftest import EMBEDDED_COSTS


@pytest.fixture(scope="module")
def engine():
    e = engine_thread.AsyncEngine(None, costs=EMBEDDED_COSTS, parallel=2)
    yield e
    e.close()


IDS = [17, 230, 41, 99, 5, 301, 12]


def test_prompt_logprobs_name_each_token_and_the_top_ones(engine):
    out = engine.prompt_logprobs(IDS, 3)
    assert out[0] is None and len(out) == len(IDS)
    for i, entry in enumerate(out[1:], start=1):
        assert IDS[i] in entry and 3 <= len(entry) <= 4
        assert all(v <= 0.0 and math.isfinite(v) for v in entry.values())
        best = sorted(entry.values(), reverse=True)[:3]
        assert entry[IDS[i]] <= best[0]


def test_an_fp8_models_prompt_logprobs_run_as_prompt_rows(engine, monkeypatch):
    model = engine.engine.model
    seen, residual = [], model.residual

    def spy(rows):
        seen.append(row_kind.split(rows.token_ids.shape[0]))
        return residual(rows)

    monkeypatch.setattr(model, "residual", spy)
    engine.prompt_logprobs(IDS, 0)
    assert seen and all(s[0][2] is False for s in seen)  # bf16: one kind, decode
    seen.clear()
    monkeypatch.setattr(engine_thread, "fp8_weights", lambda m: {"w": None})
    plain = engine.prompt_logprobs(IDS, 0)
    assert seen and all(s == [(0, len(IDS), True)] for s in seen)
    assert row_kind.split(3) == [(0, 3, False)]  # none after
    assert plain[1:] == engine.prompt_logprobs(IDS, 0)[1:]  # the reference kernels ignore it

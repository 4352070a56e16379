"""Exactness: drafted, batched and alone replies equal serial decoding (DESIGN.md section 1)."""

import pytest

from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, alone, hash_model, make_host, run_to_end, serial

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
SEEDED = SamplingParams(max_tokens=40, temperature=0.8, seed=1234)


def every_third(stream_id: int, call: int) -> int | None:
    # Every third draft call makes one of its drafts wrong, at a varying depth.
    return call % 4 if call % 3 == 2 else None


@pytest.mark.parametrize("width", range(1, 17))
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_every_verify_width_yields_the_serial_tokens(width, params):
    backend = FakeBackend(wrong=every_third)
    host = make_host(backend, mtp_drafts=width - 1, copy_drafts=0, unpriced=True)
    prompt = [11, 12, 13, 14, 15]
    seed = host.submit("r", prompt, params)
    out = run_to_end(host)["r"]
    want = serial(hash_model, prompt, seed if params.temperature > 0 else None, 40)
    assert out.token_ids == want
    assert out.finish_reason == "length"
    assert max(max(w, default=0) for w in backend.widths) == width
    if width > 1:
        assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("num_streams", range(2, 9))
@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["greedy", "seeded"])
def test_shared_rounds_equal_each_request_alone(num_streams, temperature):
    backend = FakeBackend(wrong=every_third)
    # max_rows 8 below the drafts' wish, so streams share and take turns
    lanes = {"max_rows": 8, "mtp_drafts": 3, "copy_drafts": 8, "prefill_rows": 128}
    host = make_host(backend, num_sessions=num_streams, **lanes)
    requests = {}
    for i in range(num_streams):
        prompt = [10 + (i * 7 + j * 3) % 70 for j in range(3 + 37 * i)]
        params = SamplingParams(
            max_tokens=20 + 5 * i, temperature=temperature, seed=100 + i, draft=i % 3 != 1
        )
        requests[f"r{i}"] = (prompt, params)
        host.submit(f"r{i}", prompt, params)
    outs = run_to_end(host)
    for rid, (prompt, params) in requests.items():
        lone = alone({"wrong": every_third}, prompt, params, **lanes)
        assert outs[rid].token_ids == lone.token_ids, rid
        plain = alone({}, prompt, SamplingParams(**{**_fields(params), "draft": False}))
        assert outs[rid].token_ids == plain.token_ids, rid
    assert sum(o.stats.drafted for o in outs.values()) > 0
    assert max(sum(w) for w in backend.widths) <= 8
    assert host.sessions.num_free == num_streams


def test_reply_through_the_host_equals_the_model_loop():
    prompt = list(range(10, 80))  # more than a chunk: two prompt pieces
    out = alone({}, prompt, GREEDY, prefill_rows=64)
    assert out.token_ids == serial(hash_model, prompt, None, 40)
    assert out.prompt_token_ids == prompt


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}

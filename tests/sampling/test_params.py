"""SamplingParams validation, the seed rule, and the request records (request.py)."""

import ast
import dataclasses
import math
import sys
from pathlib import Path

import pytest

from flashlane import request
from flashlane.request import (
    FinishReason,
    RequestOutput,
    RequestStats,
    SamplingParams,
    effective_seed,
)

DESIGN_DEFAULTS = dict(
    max_tokens=256, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
    presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
    stop=None, stop_token_ids=None, ignore_eos=False, n=1, logprobs=None, draft=True,
    thinking_budget=None, structured=None,  # structured: issue 32 (constrained decoding)
)  # fmt: skip


def test_fields_and_defaults_are_design_section_8():
    fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    assert fields == DESIGN_DEFAULTS


@pytest.mark.parametrize(
    "good",
    [
        dict(temperature=0), dict(temperature=0.0), dict(temperature=1e-6), dict(top_k=1),
        dict(top_k=10**6), dict(top_p=1e-9), dict(top_p=1), dict(min_p=0), dict(min_p=1.0),
        dict(repetition_penalty=1e-3), dict(seed=-5), dict(seed=2**70), dict(seed=0),
        dict(max_tokens=1), dict(n=3), dict(logprobs=0), dict(logprobs=20),
        dict(thinking_budget=0), dict(logit_bias={0: -100.0, 7: 2}), dict(logit_bias={}),
        dict(presence_penalty=-2.0, frequency_penalty=2), dict(stop="x"), dict(stop=["a", "b"]),
        dict(stop_token_ids=[1, 2]), dict(ignore_eos=True), dict(draft=False),
    ],
)  # fmt: skip
def test_accepts_valid_values(good):
    SamplingParams(**good)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
        ("temperature", "1"), ("top_k", -1), ("top_k", 2.0), ("top_k", True),
        ("top_p", 0.0), ("top_p", 1.0001), ("top_p", math.nan), ("min_p", -0.01),
        ("min_p", 1.5), ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
        ("repetition_penalty", math.inf), ("seed", 1.0), ("seed", "7"), ("seed", True),
        ("max_tokens", 0), ("max_tokens", 1.5), ("n", 0), ("logprobs", -1), ("logprobs", 21),
        ("thinking_budget", -1), ("logit_bias", {"5": 1.0}), ("logit_bias", {5: math.inf}),
        ("logit_bias", {-1: 1.0}), ("logit_bias", [(5, 1.0)]), ("presence_penalty", math.nan),
        ("frequency_penalty", math.inf), ("stop", 5), ("stop", ["a", 1]),
        ("stop_token_ids", [1, -2]), ("stop_token_ids", (1, 2)), ("ignore_eos", 1),
        ("draft", "yes"),
    ],
)  # fmt: skip
def test_rejects_bad_values_naming_the_parameter(name, bad):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{name} must be"):
        SamplingParams(**{name: bad})


def test_params_are_frozen():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5  # type: ignore[misc]
    assert dataclasses.replace(params, seed=3).seed == 3


@pytest.mark.parametrize(
    ("seed", "expected"),
    [(0, 0), (5, 5), (2**63 - 1, 2**63 - 1), (2**63, 0), (2**63 + 7, 7), (-1, 2**63 - 1),
     (-(2**63), 0), (2**64 + 3, 3)],
)  # fmt: skip
def test_effective_seed_wraps_modulo_2_63(seed, expected):
    assert effective_seed(seed) == expected


def test_effective_seed_without_a_seed_is_fresh_and_63_bit():
    seeds = {effective_seed(None) for _ in range(64)}
    assert len(seeds) == 64
    assert all(0 <= s < 2**63 for s in seeds)
    assert max(seeds) >= 2**60  # drawn from the full range, not a small one


def test_finish_reasons_are_strings():
    assert [r.value for r in FinishReason] == ["stop", "length", "abort", "error"]
    assert FinishReason.STOP == "stop"
    assert FinishReason("length") is FinishReason.LENGTH


def test_request_output_and_stats():
    stats = RequestStats()
    assert dataclasses.astuple(stats) == (0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0)
    out = RequestOutput("r1", [1, 2], [3], "x", FinishReason.STOP, 42, stats)
    assert (out.error, out.logprobs, out.seed) == (None, None, 42)
    assert RequestOutput("r2", [], [], "", None, 1, RequestStats(rounds=2)).stats.rounds == 2


def test_request_module_imports_only_the_standard_library():
    # The lane core imports request.py and is torch-free (DESIGN.md section 2).
    tree = ast.parse(Path(request.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    roots = {name.split(".")[0] for name in names} - {"__future__"}
    assert roots <= set(sys.stdlib_module_names), roots

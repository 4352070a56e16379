"""Constrained decoding on the embedded model: replies obey their grammar, and a constrained
seeded reply is the same alone, beside 8 other streams, drafted and undrafted (the mask is
applied before the keyed draw; drafts verify against masked rows)."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams, StructuredOutput
from flashlane.sampling.grammar import GrammarError, check
from tests.runner.test_lone import lone_run

COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
PROMPT = 'def parse(config):\n    """Return the settings as JSON."""\n'
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
JSON = StructuredOutput(json=json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def llm():
    return LLM(None, costs=COSTS, parallel=9, max_rows=16)


def test_json_schema_reply_validates(llm):
    for seed in range(3):
        p = SamplingParams(max_tokens=60, temperature=0.9, seed=seed, structured=JSON)
        out = llm.generate(PROMPT, p)[0]
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_regex_and_choice(llm):
    regex = StructuredOutput(regex=r"[0-9]{3}-[a-z]{2,5}")
    out = llm.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0.0, structured=regex))
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", out[0].text)
    choice = StructuredOutput(choice=("yes", "no", "maybe"))
    for seed in range(4):
        p = SamplingParams(max_tokens=10, temperature=1.0, seed=seed, structured=choice)
        assert llm.generate(PROMPT, p)[0].text in ("yes", "no", "maybe")


def test_constrained_reply_is_the_same_alone_batched_and_drafted(llm):
    p = SamplingParams(max_tokens=60, temperature=0.8, seed=7, structured=JSON)
    alone = llm.generate(PROMPT, p)[0]
    assert alone.stats.drafted > alone.stats.accepted > 0  # drafts landed and were refused
    others = [SamplingParams(max_tokens=40, temperature=0.9, seed=i) for i in range(7)]
    others.append(dataclasses.replace(p, seed=8))  # another constrained stream beside it
    batched = llm.generate([PROMPT] + [f"import os{i}\n" for i in range(8)], [p, *others])
    undrafted = llm.generate(PROMPT, dataclasses.replace(p, draft=False))[0]
    assert batched[0].token_ids == alone.token_ids
    assert undrafted.token_ids == alone.token_ids
    assert undrafted.stats.drafted == 0


def test_unconstrained_rounds_do_no_grammar_work(llm, monkeypatch):
    def refuse(*args):
        raise AssertionError("a grammar was consulted for an unconstrained round")

    monkeypatch.setattr(type(llm.engine.backend), "_constrain", refuse)
    out = llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0.0))
    assert len(out[0].token_ids) == 8


def test_bad_grammars_are_refused_before_the_engine():
    with pytest.raises(GrammarError, match="regex"):
        check(StructuredOutput(regex="[a-"))
    with pytest.raises(GrammarError, match="not JSON"):
        check(StructuredOutput(json="{nope"))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutput(json="{}", regex="a")
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured=StructuredOutput(regex="a"), ignore_eos=True)


def test_constrained_streams_stay_in_shared_rounds(llm):
    """The lone driver draws unmasked rows: a constrained stream never goes lone, and its reply
    is the shared rounds' (a free greedy stream does go lone)."""
    p = SamplingParams(max_tokens=40, temperature=0.0, structured=JSON)
    want = llm.generate(PROMPT, p)[0].token_ids
    (got, driver) = lone_run(llm, lambda: llm.generate(PROMPT, p)[0].token_ids, steps=8)
    assert got == want and driver.num_steps == 0
    free = SamplingParams(max_tokens=8, temperature=0.0)
    (_, driver) = lone_run(llm, lambda: llm.generate(PROMPT, free), steps=8)
    assert driver.num_steps > 0

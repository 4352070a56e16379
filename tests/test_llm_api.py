"""vLLM's offline API shape on the embedded model: LLM(max_model_len=...),
generate(prompts, sampling_params), RequestOutput.outputs[i].text, n > 1, LLM.chat, and
the embedded model's chats with the think block closed."""

from __future__ import annotations

import pytest

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=1024, max_num_seqs=4, seed=100, costs=COSTS)


def test_vllm_keywords_reach_the_engine(llm):
    assert list(llm.engine.plan.capacities) == [1024] * 4
    assert llm.engine.max_rows == 16  # four sessions' windows (9 rows each) fill the CPU's 16


def test_rows_sized_to_one_session_change_no_reply(llm):
    """--max-rows unset: one session's engine verifies at most its widest window (1 + the
    longest draft: a copy of 8) a round, and replies as the four-session engine does."""
    drafted = SamplingParams(max_tokens=24, temperature=0.0)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    one = LLM(max_model_len=1024, max_num_seqs=1, seed=100, costs=COSTS)
    assert one.engine.max_rows == one.engine.plan.max_rows == 9
    assert one.generate(prompt, drafted)[0].token_ids == llm.generate(prompt, drafted)[0].token_ids
    fixed = LLM(max_model_len=1024, max_num_seqs=1, seed=100, costs=COSTS, max_rows=16)
    assert fixed.engine.max_rows == 16


def test_generate_with_sampling_params_and_outputs(llm):
    outs = llm.generate(["import os\n", "def f(x):\n"], sampling_params=GREEDY)
    assert [o.prompt for o in outs] == ["import os\n", "def f(x):\n"]
    for out in outs:
        assert out.finished and len(out.outputs) == 1
        assert out.outputs[0].text == out.text and out.outputs[0].token_ids == out.token_ids
    # the positional second argument and our older keyword say the same
    assert llm.generate("import os\n", GREEDY)[0].text == outs[0].text
    assert llm.generate("import os\n", params=GREEDY)[0].text == outs[0].text
    # vLLM's prompt dicts, text or token ids
    ids = outs[0].prompt_token_ids
    as_dicts = llm.generate([{"prompt": "import os\n"}, {"prompt_token_ids": ids}], GREEDY)
    assert [o.text for o in as_dicts] == [outs[0].text] * 2
    assert as_dicts[0].prompt == "import os\n" and as_dicts[1].prompt is None
    with pytest.raises(TypeError, match="not both"):
        llm.generate("x", GREEDY, params=GREEDY)


def test_n_choices_use_seed_plus_j(llm):
    params = SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=41)
    out = llm.generate("class A:\n", params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert [c.seed for c in out.outputs] == [41, 42, 43]
    for choice in out.outputs:
        alone = SamplingParams(max_tokens=6, temperature=1.0, seed=choice.seed)
        assert llm.generate("class A:\n", alone)[0].token_ids == choice.token_ids


def test_engine_seed_numbers_requests_without_one(llm):
    sampled = SamplingParams(max_tokens=2, temperature=1.0)
    first, second = llm.generate(["a", "b"], sampled)
    assert second.seed == first.seed + 1 and first.seed >= 100


def test_chat_answers_with_the_think_block_closed(llm):
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    out = llm.chat(messages, SamplingParams(max_tokens=24, temperature=0.0))[0]
    prompt = llm.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert out.text and "<think>" not in out.text
    on = llm.chat(
        messages, SamplingParams(max_tokens=1), chat_template_kwargs={"enable_thinking": True}
    )[0]
    assert llm.tokenizer.decode(on.prompt_token_ids, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n<think>\n"
    )
    two = llm.chat([messages, messages], SamplingParams(max_tokens=24, temperature=0.0))
    assert [o.text for o in two] == [out.text, out.text]

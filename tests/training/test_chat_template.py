"""The shipped chat template: ChatML roles, thinking on and off, tools and tool calls."""

import json
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

MODEL_DIR = Path(__file__).parents[2] / "flashlane" / "default_model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & later",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def render(messages, **kwargs) -> str:
    # The environment transformers uses: trim/lstrip blocks and a tojson that does not escape.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    template = env.from_string((MODEL_DIR / "chat_template.jinja").read_text())
    return template.render(messages=messages, **kwargs)


def test_system_user_assistant():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "Again"}]},
    ]
    assert render(msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
    )


def test_generation_prompt_thinking_on_and_off():
    msgs = [{"role": "user", "content": "Hi"}]
    head = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(msgs, add_generation_prompt=True) == head + "<think>\n"
    on = render(msgs, add_generation_prompt=True, enable_thinking=True)
    assert on == head + "<think>\n"
    off = render(msgs, add_generation_prompt=True, enable_thinking=False)
    assert off == head + "<think>\n\n</think>\n\n"


def test_reasoning_kept_only_after_the_last_query():
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "old thought"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "<think>\nnew thought\n</think>\n\nd"},
    ]
    out = render(msgs)
    assert "old thought" not in out
    assert out.endswith("<|im_start|>assistant\n<think>\nnew thought\n</think>\n\nd<|im_end|>\n")


def test_tools_and_xml_tool_calls():
    msgs = [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                },
                {"type": "function", "function": {"name": "get_time", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "noon"},
    ]
    out = render(msgs, tools=TOOLS, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nSys.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in out
    assert (
        "<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call><|im_end|>\n"
    ) in out
    assert out.endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nnoon\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_tools_without_system_message():
    out = render([{"role": "user", "content": "x"}], tools=TOOLS)
    assert out.startswith("<|im_start|>system\n# Tools\n")
    assert out.endswith("</IMPORTANT><|im_end|>\n<|im_start|>user\nx<|im_end|>\n")


def test_transformers_renders_the_same():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {
            "role": "assistant",
            "content": "A",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"k": [1, "<v>"]}}}
            ],
        },
        {"role": "tool", "content": "R"},
    ]
    for thinking in (True, False):
        want = render(msgs, tools=TOOLS, add_generation_prompt=True, enable_thinking=thinking)
        got = tok.apply_chat_template(
            msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert got == want
    assert '<parameter=k>\n[1, "<v>"]\n</parameter>' in want


@pytest.mark.parametrize("thinking", [True, False])
def test_agentic_turn_rerenders_as_a_prefix(thinking):
    msgs = [{"role": "user", "content": "Weather?"}]
    prompt = render(msgs, tools=TOOLS, add_generation_prompt=True, enable_thinking=thinking)
    reasoning = "need the tool" if thinking else ""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "X"}}}
    turn = {
        "role": "assistant",
        "content": "",
        "reasoning_content": reasoning,
        "tool_calls": [call],
    }
    later = render(
        [*msgs, turn, {"role": "tool", "content": "rain"}],
        tools=TOOLS,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    assert later.startswith(prompt)

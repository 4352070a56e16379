"""README's promises kept: it opens with the two commands, the generate command runs as
written, the Python lines of its tour run, and every vLLM / llama.cpp flag its table names is
one `flashlane serve` takes."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from flashlane.cli import build_parser, main

README = (Path(__file__).parents[1] / "README.md").read_text()
RUN = (
    "pip install torch==2.13.0 && pip install -e . && flashlane generate --prompt "
    '"def fibonacci(n):" --max-tokens 64'
)
TEST = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q"


def test_readme_opens_with_the_two_commands():
    assert README.startswith(f"# flashlane\n\n    {RUN}\n\n    {TEST}\n\n")


def test_the_generate_command_runs_as_written(capsys, monkeypatch):
    monkeypatch.setenv("FLASHLANE_UNPRICED", "1")  # the same tokens, no cost timing
    command = RUN.split(" && ")[-1]
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def fibonacci(n):") and len(out) > len("def fibonacci(n):\n")


def test_the_tours_python_runs(capsys, monkeypatch):
    monkeypatch.setenv("FLASHLANE_UNPRICED", "1")
    block = re.search(r"\n(    from flashlane import LLM.*?)\n\n", README, re.S).group(1)
    exec(textwrap.dedent(block), {})
    printed = capsys.readouterr().out
    assert printed.strip() and len(printed.splitlines()) >= 2


def table_flags() -> list[str]:
    table = README[README.index("| vLLM / llama.cpp |") :]
    table = table[: table.index("\n\n")]
    flags = []
    for row in table.splitlines()[2:]:
        theirs = row.split("|")[1]
        flags += [f for f in re.findall(r"`(-[\w-]+)", theirs) if f != "--speculative-config"]
    return flags


@pytest.mark.parametrize("flag", table_flags())
def test_every_flag_of_the_table_is_taken(flag):
    values = {
        "--enable-prefix-caching": [],
        "--default-chat-template-kwargs": ["{}"],
        "--gpu-memory-utilization": ["0.5"],
        "--max-model-len": ["64"],
        "-c": ["64"],
        "--max-num-seqs": ["2"],
        "-np": ["2"],
        "--seed": ["1"],
        "--port": ["8000"],
        "--quantization": ["fp8"],
        "-q": ["fp8"],
        "--kv-cache-dtype": ["fp8"],
    }
    build_parser().parse_args(["serve", flag, *values.get(flag, ["x"])])

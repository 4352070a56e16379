"""Against a built llama.cpp (FLASHLANE_LLAMA_CPP; skipped without one): a random checkpoint's
GGUF, written through the lazy index, holds our numbers and llama.cpp decodes it; and the
embedded model's greedy replies on the CPU are the same tokens in llama.cpp as in ours."""

from __future__ import annotations

import json
import os

import pytest
import torch

from flashlane.config import DEFAULT_MODEL
from flashlane.llama_cpp import tools
from flashlane.llama_cpp.build import find_build
from flashlane.llama_cpp.converter_fixes import load_converter
from flashlane.llama_cpp.server import LlamaServer
from flashlane.llama_cpp.write_gguf import write_gguf
from flashlane.models.random_weights import random_tensor
from flashlane.request import SamplingParams
from tests.llama_cpp.replies import count_equal_but_near_ties

pytestmark = pytest.mark.skipif(
    not os.environ.get("FLASHLANE_LLAMA_CPP"), reason="no llama.cpp build (set FLASHLANE_LLAMA_CPP)"
)
PROMPTS = [
    'def walk(top):\n    """Directory tree generator."""\n    for name in listdir(top):\n',
    "The river ran past the old stone mill, and the miller's daughter",
    "<|im_start|>user\nWrite a haiku about rain.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def build():
    found = find_build()  # a wrong FLASHLANE_LLAMA_CPP fails here rather than skipping
    assert found.src is not None, "the build's CMakeCache.txt names no source"
    return found


@pytest.fixture(scope="module")
def embedded_gguf(build, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / "embedded.gguf"
    write_gguf(out, build.src, checkpoint=DEFAULT_MODEL)
    return out


def _tensor(reader, name: str) -> torch.Tensor:
    t = next(t for t in reader.tensors if t.name == name)
    data = torch.frombuffer(bytearray(t.data.tobytes()), dtype=torch.bfloat16)
    return data.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))


def test_random_gguf_holds_our_numbers_and_llama_cpp_decodes_it(build, tmp_path):
    raw = json.loads((DEFAULT_MODEL / "config.json").read_text())
    out = tmp_path / "random.gguf"
    assert write_gguf(out, build.src, raw, seed=5, device="cpu") is True
    assert write_gguf(out, build.src, raw, seed=5, device="cpu") is False  # kept
    load_converter(build.src)
    from gguf import GGUFReader  # llama.cpp's gguf-py, put on the path just above

    reader = GGUFReader(out)
    for ours, theirs in (
        ("embed_tokens.weight", "token_embd.weight"),
        ("lm_head.weight", "output.weight"),
    ):
        got = _tensor(reader, theirs)
        assert torch.equal(got, random_tensor(ours, tuple(got.shape), torch.bfloat16, "cpu", 5))
    ratios = reader.fields["qwen4exp.attention.compress_ratios"].contents()
    assert ratios == [0, 0, 0, 4, 0, 0, 0, 4, 4]  # the sparse layers and the MTP block
    ran = tools.decode(build, out, [1, 2], 16, 4, gpu=False, threads=2)
    assert all(r["tok_s"] > 0 for r in ran["decode"].values())


def _ours(prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    from flashlane.llm import LLM

    llm = LLM(None, device="cpu")
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompts, params)]


def _parity(build, gguf, num_tokens: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    prompts = [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    with LlamaServer(build, gguf, context=1024, extra=("-t", "2")) as server:
        # the GGUF names the qwen35 pre-tokenizer for ours (converter_fixes): the same ids
        assert [server.tokenize(p) for p in PROMPTS] == prompts
        theirs = [server.greedy(p, num_tokens) for p in prompts]
    ours = _ours(prompts, num_tokens)
    for p, a, b in zip(PROMPTS, ours, theirs):
        assert len(a) == len(b) == num_tokens
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert first is None, f"{p[:30]!r}: token {first} differs: ours {a[first]}, {b[first]}"


def test_embedded_model_greedy_tokens_equal_llama_cpp(build, embedded_gguf):
    _parity(build, embedded_gguf, 64)


@pytest.mark.slow
@pytest.mark.parametrize("num_tokens", [200, 300])
def test_embedded_model_long_greedy_replies_equal_llama_cpp(build, embedded_gguf, num_tokens):
    _parity(build, embedded_gguf, num_tokens)


def test_bench_model_peer_llama_cpp_on_the_cpu(build, tmp_path, capsys):
    """The whole peer run on a small config: the GGUF written, both sides in the JSON."""
    from flashlane.bench.model import bench_model_main

    out = tmp_path / "r.json"
    argv = [
        "--config",
        str(DEFAULT_MODEL / "config.json"),
        "--random-weights",
        "--device",
        "cpu",
        "--streams",
        "1,2",
        "--prefill",
        "64",
        "--decode-tokens",
        "4",
        "--peer",
        "llama.cpp",
        "--llama-cpp",
        str(build.bin_dir),
        "--gguf-dir",
        str(tmp_path),
        "--llama-threads",
        "2",
        "--json",
        str(out),
    ]
    assert bench_model_main(argv) == 0
    result = json.loads(out.read_text())
    peer = result["peer"]
    assert peer["llama.cpp"] == build.build and peer["gguf_written_s"] > 0
    assert set(peer["decode"]) == {"1", "2"} and peer["prefill"]["64"]["tok_s"] > 0
    assert peer["build_number"] == 11434
    assert "ours/peer" in capsys.readouterr().out


# A reply may part from ours only where our top two logits nearly tie (llama.cpp sums bf16
# weights in fp32, ours in fp64): bench serve's 16 prompts had two such places in 64 tokens,
# gaps of 0.014 and 0.004 between logits of about 9; a wrong conversion parts far wider.
NEAR_TIE = 0.05


@pytest.mark.slow
def test_served_replies_equal_ours_but_at_near_ties(build, embedded_gguf):
    """bench serve's 16 prompts served by llama-server four at a time (its slots batch them):
    each reply is ours, or parts from ours where our logits tie within NEAR_TIE."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    from flashlane.bench.serve import load_tokenizer, make_prompts
    from flashlane.llm import LLM

    args = argparse.Namespace(seed=None, num_prompts=16, input_len=64, output_len=64)
    prompts = make_prompts(load_tokenizer(DEFAULT_MODEL), args)
    with (
        LlamaServer(build, embedded_gguf, context=4 * 256, slots=4, extra=("-t", "2")) as server,
        ThreadPoolExecutor(4) as pool,
    ):
        theirs = list(pool.map(lambda p: server.greedy(p, 64), prompts))
    llm = LLM(None, device="cpu")
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    ours = [list(o.token_ids) for o in llm.generate(prompts, params)]
    assert count_equal_but_near_ties(llm, prompts, ours, theirs, NEAR_TIE) >= 12

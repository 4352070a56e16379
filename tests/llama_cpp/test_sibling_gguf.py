"""The siblings' GGUFs (Qwen3-Next, Qwen3.5-MoE, Qwen3.5): the lazy index the converter reads
is transformers' checkpoint names holding our random numbers, and, with llama.cpp's source at
hand (FLASHLANE_LLAMA_CPP_SRC, or the source of the FLASHLANE_LLAMA_CPP build; skipped without
one), the GGUF its converter writes holds them under llama.cpp's names and arch; with a build
(FLASHLANE_LLAMA_CPP), llama.cpp decodes it, `bench model --peer llama.cpp` runs on it, and
llama.cpp's greedy replies are ours."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from flashlane.llama_cpp.converter_fixes import load_converter
from flashlane.llama_cpp.write_gguf import random_index, write_gguf
from flashlane.models.loader import load_checkpoint
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random, fill_transformers
from tests.llama_cpp.replies import count_equal_but_near_ties
from tests.oracle import hf_classes

# preset -> llama.cpp's arch (general.architecture)
SIBLINGS = {
    "qwen3-next-tiny": "qwen3next",
    "qwen3.5-moe-tiny": "qwen35moe",
    "qwen3.5-tiny": "qwen35",
}


def _gguf_config(name: str) -> dict:
    """A tiny sibling llama.cpp can read: the embedded tokenizer's 8192 words, and the MoE in
    every layer (llama.cpp's qwen3next has no dense layers; qwen3-next-tiny's layer 1 is)."""
    return dict(preset(name), vocab_size=8192, mlp_only_layers=[])


@pytest.mark.parametrize("name", SIBLINGS)
def test_lazy_index_is_transformers_names_with_our_numbers(name, tmp_path):
    raw = preset(name)
    index = random_index(raw, seed=3, device="cpu")
    made = {}
    for n, (shape, dtype, make) in index.items():
        made[n] = make()
        assert tuple(made[n].shape) == tuple(shape) and made[n].dtype == dtype, n
    # the trunk: transformers' parameters, filled with our numbers as the parity tests fill them
    spec = {k: v for k, v in raw.items() if k not in ("model_type", "mtp_num_hidden_layers")}
    model_class, config_class = hf_classes(raw["model_type"])
    theirs = model_class(config_class(**spec)).to(torch.bfloat16)
    fill_transformers(theirs, seed=3)
    want = theirs.state_dict()
    assert {n for n in made if not n.startswith("mtp.")} == set(want)
    for n, value in want.items():
        assert torch.equal(made[n], value), n
    if name == "qwen3-next-tiny":  # its checkpoints' fused GDN inputs, as its converter reads
        assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in made
    # everything, the MTP head too: a checkpoint our loader reads as build_random's model
    from safetensors.torch import save_file

    save_file(made, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _, loaded = load_checkpoint(tmp_path, torch.bfloat16)
    _, ours = build_random(raw, torch.bfloat16, "cpu", seed=3)
    got, expected = loaded.state_dict(), ours.state_dict()
    assert any(n.startswith("mtp.") for n in expected) and set(got) == set(expected)
    for n, value in expected.items():
        assert torch.equal(got[n], value), n


def test_a_sibling_llama_cpp_cannot_hold_is_refused_before_writing(tmp_path):
    raw = dict(preset("qwen3-next-tiny"), vocab_size=8192)  # layer 1 dense
    with pytest.raises(ValueError, match=r"MoE in every layer.*\[1\]"):
        write_gguf(tmp_path / "x.gguf", tmp_path / "no-src", raw)
    raw = dict(_gguf_config("qwen3.5-tiny"), linear_value_head_dim=32)
    with pytest.raises(ValueError, match="linear_key_head_dim 16 != linear_value_head_dim 32"):
        write_gguf(tmp_path / "x.gguf", tmp_path / "no-src", raw)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def llama_src() -> Path:
    if src := os.environ.get("FLASHLANE_LLAMA_CPP_SRC"):
        return Path(src)
    if os.environ.get("FLASHLANE_LLAMA_CPP"):
        from flashlane.llama_cpp.build import find_build

        return find_build().src
    pytest.skip("no llama.cpp source (set FLASHLANE_LLAMA_CPP_SRC or FLASHLANE_LLAMA_CPP)")


@pytest.fixture(scope="module")
def sibling_gguf(llama_src, tmp_path_factory):
    """name -> the GGUF of its _gguf_config at seed 5, written once per module."""
    folder = tmp_path_factory.mktemp("siblings")

    def written(name: str) -> Path:
        out = folder / f"{name}.gguf"
        if not out.is_file():
            assert write_gguf(out, llama_src, _gguf_config(name), seed=5, device="cpu")
        return out

    return written


def _tensor(reader, name: str) -> torch.Tensor:
    """A GGUF tensor as torch lays it out (GGUF lists the dims the other way round)."""
    t = next(t for t in reader.tensors if t.name == name)
    dtype = {"BF16": torch.bfloat16, "F32": torch.float32}[t.tensor_type.name]
    data = torch.frombuffer(bytearray(t.data.tobytes()), dtype=dtype)
    return data.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))


def _tiled(x: torch.Tensor, num_k_heads: int, width: int) -> torch.Tensor:
    """Rows of value heads grouped by key head [K0v0, K0v1, K1v0, ...], as qwen35's converter
    writes them: tiled [K0v0, K1v0, K0v1, ...] (each head `width` rows)."""
    return x.unflatten(0, (num_k_heads, -1, width)).transpose(0, 1).flatten(0, 2)


@pytest.mark.parametrize("name, arch", SIBLINGS.items())
def test_sibling_gguf_holds_our_numbers_under_llama_cpp_names(sibling_gguf, llama_src, name, arch):
    reader = _reader(llama_src, sibling_gguf(name))
    assert reader.fields["general.architecture"].contents() == arch
    assert reader.fields[f"{arch}.nextn_predict_layers"].contents() == 1  # the MTP head kept
    cfg, model = build_random(_gguf_config(name), torch.bfloat16, "cpu", seed=5)
    ours = model.state_dict()
    mtp = cfg.num_layers  # the MTP block follows the trunk's
    pairs = {
        "token_embd.weight": "embed_tokens.weight",
        "output.weight": "lm_head.weight",
        "blk.3.attn_q.weight": "layers.3.self_attn.q_proj.weight",  # q and its gate, per head
        "blk.3.attn_k.weight": "layers.3.self_attn.k_proj.weight",
        "blk.3.attn_output.weight": "layers.3.self_attn.o_proj.weight",
        f"blk.{mtp}.nextn.eh_proj.weight": "mtp.fc.weight",
        f"blk.{mtp}.attn_q.weight": "mtp.layers.0.self_attn.q_proj.weight",
    }
    if arch == "qwen35":
        pairs |= {"blk.0.ffn_gate.weight": "layers.0.mlp.gate_proj.weight",
                  f"blk.{mtp}.ffn_down.weight": "mtp.layers.0.mlp.down_proj.weight"}  # fmt: skip
    else:
        for blk, layer in (("blk.0", "layers.0"), (f"blk.{mtp}", "mtp.layers.0")):
            pairs |= {
                f"{blk}.ffn_gate_inp.weight": f"{layer}.mlp.gate.weight",
                f"{blk}.ffn_gate_exps.weight": f"{layer}.mlp.experts.gate_proj",
                f"{blk}.ffn_up_exps.weight": f"{layer}.mlp.experts.up_proj",
                f"{blk}.ffn_down_exps.weight": f"{layer}.mlp.experts.down_proj",
                f"{blk}.ffn_up_shexp.weight": f"{layer}.mlp.shared_expert.up_proj.weight",
            }
    for theirs, mine in pairs.items():
        got = _tensor(reader, theirs)
        assert torch.equal(got, ours[mine].to(got.dtype)), (theirs, mine)
    gdn = {p: ours[f"layers.0.linear_attn.in_proj_{p}.weight"] for p in ("qkv", "z", "b", "a")}
    nk, qk = cfg.linear_num_k_heads, cfg.linear_num_k_heads * cfg.linear_k_head_dim
    if arch == "qwen3next":
        # its converter unfuses in_proj_qkvz into our in_proj_qkv and in_proj_z exactly
        assert torch.equal(_tensor(reader, "blk.0.attn_qkv.weight"), gdn["qkv"])
        assert torch.equal(_tensor(reader, "blk.0.attn_gate.weight"), gdn["z"])
        ba = torch.cat([gdn["b"].unflatten(0, (nk, -1)), gdn["a"].unflatten(0, (nk, -1))], 1)
        assert torch.equal(_tensor(reader, "blk.0.ssm_ba.weight"), ba.flatten(0, 1))
    else:
        dv = cfg.linear_v_head_dim
        q_k, v = gdn["qkv"][: 2 * qk], gdn["qkv"][2 * qk :]
        qkv = torch.cat([q_k, _tiled(v, nk, dv)])
        assert torch.equal(_tensor(reader, "blk.0.attn_qkv.weight"), qkv)
        assert torch.equal(_tensor(reader, "blk.0.attn_gate.weight"), _tiled(gdn["z"], nk, dv))
        assert torch.equal(_tensor(reader, "blk.0.ssm_beta.weight"), _tiled(gdn["b"], nk, 1))
        assert torch.equal(_tensor(reader, "blk.0.ssm_alpha.weight"), _tiled(gdn["a"], nk, 1))
    if arch == "qwen35":
        assert f"{arch}.expert_count" not in reader.fields  # dense: no experts written


def _reader(llama_src: Path, path: Path):
    load_converter(llama_src)
    from gguf import GGUFReader  # llama.cpp's gguf-py, put on the path just above

    return GGUFReader(path)


@pytest.mark.skipif(
    not os.environ.get("FLASHLANE_LLAMA_CPP"), reason="no llama.cpp build (set FLASHLANE_LLAMA_CPP)"
)
@pytest.mark.parametrize("name", SIBLINGS)
def test_llama_cpp_decodes_the_sibling_gguf(sibling_gguf, name):
    from flashlane.llama_cpp import tools
    from flashlane.llama_cpp.build import find_build

    ran = tools.decode(find_build(), sibling_gguf(name), [1, 2], 16, 4, gpu=False, threads=2)
    assert set(ran["decode"]) == {1, 2}
    assert all(r["tok_s"] > 0 for r in ran["decode"].values())


@pytest.mark.skipif(
    not os.environ.get("FLASHLANE_LLAMA_CPP"), reason="no llama.cpp build (set FLASHLANE_LLAMA_CPP)"
)
@pytest.mark.parametrize("name", SIBLINGS)
def test_bench_model_peer_llama_cpp_for_a_sibling(name, tmp_path):
    """`bench model --peer llama.cpp` on a tiny sibling's config.json: the GGUF written in
    --gguf-dir, both sides timed."""
    from flashlane.bench.model import bench_model_main
    from flashlane.llama_cpp.build import find_build

    config = tmp_path / name / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(_gguf_config(name)))
    out = tmp_path / "r.json"
    argv = [
        "--config", str(config), "--random-weights", "--device", "cpu", "--streams", "1,2",
        "--prefill", "64", "--decode-tokens", "4", "--peer", "llama.cpp",
        "--llama-cpp", str(find_build().bin_dir), "--gguf-dir", str(tmp_path),
        "--llama-threads", "2", "--json", str(out),
    ]  # fmt: skip
    assert bench_model_main(argv) == 0
    peer = json.loads(out.read_text())["peer"]
    assert Path(peer["gguf"]) == tmp_path / f"{name}-seed0-bf16.gguf"
    assert peer["gguf_written_s"] > 0 and set(peer["decode"]) == {"1", "2"}
    assert all(r["tok_s"] > 0 for r in peer["decode"].values())
    assert peer["prefill"]["64"]["tok_s"] > 0


# A random tiny model's top two logits sit a few hundredths apart (its top logit is about
# 0.6), and llama.cpp's CPU products round activations to bf16: a reply may part from ours
# only where our two candidates are this close. Measured with llama.cpp b11434 on the CPU
# (4 prompts x 16 tokens): seed 0, every reply equal in each family; seed 5 (here), the same
# but for two Qwen3.5 replies parting at gaps of 0.0007 and 0.0004; a GGUF of other weights
# parts at the first token, at gaps of 0.44 to 0.85.
NEAR_TIE = 0.005


@pytest.mark.skipif(
    not os.environ.get("FLASHLANE_LLAMA_CPP"), reason="no llama.cpp build (set FLASHLANE_LLAMA_CPP)"
)
@pytest.mark.parametrize("name", SIBLINGS)
def test_llama_cpp_greedy_replies_on_the_sibling_gguf_are_ours(sibling_gguf, name):
    """The GGUF means what our model means: llama.cpp's greedy replies are ours (the same
    bf16 weights, ours computed in fp32), but at near ties."""
    from flashlane.config import EngineConfig
    from flashlane.engine import Engine
    from flashlane.llama_cpp.build import find_build
    from flashlane.llama_cpp.server import LlamaServer
    from flashlane.llm import LLM
    from flashlane.request import SamplingParams

    cfg, model = build_random(_gguf_config(name), torch.bfloat16, "cpu", seed=5)
    config = EngineConfig.resolve(
        device="cpu", parallel=1, context=256, drafts=False, prompt_cache_gb=0
    )
    llm = LLM.from_engine(Engine(config, built=(cfg, model.float()), log=lambda *_: None))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (12,), generator=g).tolist() for _ in range(4)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ours = [list(o.token_ids) for o in llm.generate(prompts, params)]
    with LlamaServer(find_build(), sibling_gguf(name), context=256, extra=("-t", "2")) as server:
        theirs = [server.greedy(p, 16) for p in prompts]
    assert count_equal_but_near_ties(llm, prompts, ours, theirs, NEAR_TIE) >= 1

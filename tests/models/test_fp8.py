"""Block-FP8 checkpoints (models/fp8.py): the arithmetic, and a tiny qwen4_exp quantized to a
block-FP8 checkpoint that loads to its dequantized twin's logits bit for bit on the CPU."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flashlane.cli import main
from flashlane.config import DEFAULT_MODEL, EngineConfig
from flashlane.flags import FlagParser, engine_flags, engine_options
from flashlane.models.config import ModelConfig
from flashlane.models.fp8 import (
    FP8_MAX,
    QuantizationError,
    QuantSpec,
    dequantize_blocks,
    dequantize_state,
    quantize_blocks,
    quantize_state,
)
from flashlane.models.loader import CheckpointError, load_checkpoint
from flashlane.models.weight_bytes import fp8_bytes

# The embedded (trained) model quantized at load against itself, 16 tokens of code, measured
# 2026-12-01: max |dlogit| / max |logit| 0.0288, max KL(original || FP8) 0.0066 nats, every
# argmax the same. The tiny random oracle is no yardstick: it is chaotic (rounding its weights
# to bf16 alone moves its logits by 0.51 of the largest; FP8, 0.78).
FP8_REL_TOL = 0.05
FP8_KL_TOL = 0.02


def read_plain(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as h:
        return {n: h.get_tensor(n) for n in h.keys()}  # noqa: SIM118 (a safe_open handle)


def write_checkpoint(src, dst, tensors, quantization=None):
    """dst: src's config.json (with quantization_config when given) and these tensors."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    if quantization is not None:
        config["quantization_config"] = quantization
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def fp8_trio(tiny_ckpt, tmp_path_factory):
    """(original, its block-FP8 checkpoint, the FP8 values dequantized as a float64 one)."""
    spec = QuantSpec()
    base = tmp_path_factory.mktemp("fp8")
    quantized = quantize_state(read_plain(tiny_ckpt), spec)
    fp8 = write_checkpoint(tiny_ckpt, base / "fp8", quantized, spec.to_config())
    twin = write_checkpoint(
        tiny_ckpt, base / "twin", dequantize_state(quantized, spec, torch.float64)
    )
    return tiny_ckpt, fp8, twin


def logits(folder, quantize=None):
    cfg, model = load_checkpoint(folder, dtype=torch.float64, quantize=quantize)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (1, 40), generator=g)
    return model.forward_train(ids)[0][0]


def test_quantize_blocks_reference_semantics():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(10, 7, generator=g, dtype=torch.float64)
    w[4:8, 4:] = 0  # a zero block keeps scale 1
    q, s = quantize_blocks(w, (4, 4))
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (3, 2)  # partial edge blocks
    block = w[4:8, :4].abs().max().float() / FP8_MAX
    assert s[1, 0] == block and s[1, 1] == 1.0
    # each block's largest |value| lands on 448 exactly
    assert q.float()[:4, :4].abs().max() == FP8_MAX
    back = dequantize_blocks(q, s, torch.float64, (4, 4))
    assert back.shape == w.shape and back[4:8, 4:].abs().max() == 0
    assert ((back - w).abs() <= w.abs().max() * 2**-4).all()
    expected = q.double() * s.double().repeat_interleave(4, 0).repeat_interleave(4, 1)[:10, :7]
    assert torch.equal(back, expected)


def test_dequantize_blocks_rejects_a_wrong_scale_grid():
    q, s = quantize_blocks(torch.randn(300, 130))
    assert s.shape == (3, 2)
    with pytest.raises(QuantizationError, match=r"scale shape \(2, 2\).*expected \(3, 2\)"):
        dequantize_blocks(q, s[:2], torch.float64)


def test_modules_to_not_convert_match_as_transformers():
    spec = QuantSpec()
    assert spec.is_converted("model.layers.0.mlp.experts.3.gate_proj.weight")
    assert spec.is_converted("mtp.layers.0.self_attn.q_proj.weight")
    for kept in (
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.0.attn_hyper_connection.block_inject_weight.weight",
        "model.hyper_connection_mixer.input_mix_weight_up.weight",
        "model.layers.1.ple.ple_embedding.ngram_embedding.shard_0.weight",
        "model.layers.0.linear_attn.in_proj_b.weight",
        "model.layers.0.input_layernorm.bias",
    ):
        assert not spec.is_converted(kept), kept
    custom = QuantSpec.from_config(
        {
            "quant_method": "fp8",
            "weight_block_size": [64, 32],
            "modules_to_not_convert": ["model.layers.0"],
        }
    )
    assert custom.block == (64, 32)
    assert not custom.is_converted("model.layers.0.self_attn.q_proj.weight")
    assert custom.is_converted("model.layers.1.self_attn.q_proj.weight")


def test_fp8_checkpoint_stores_fp8(fp8_trio):
    _, fp8, _ = fp8_trio
    t = read_plain(fp8)
    q = t["model.layers.3.self_attn.q_proj.weight"]
    assert q.dtype == torch.float8_e4m3fn
    assert t["model.layers.3.self_attn.q_proj.weight_scale_inv"].shape == (2, 1)
    assert t["lm_head.weight"].dtype == torch.float32
    assert "model.layers.0.mlp.gate.weight_scale_inv" not in t


def test_fp8_logits_equal_the_dequantized_twin(fp8_trio):
    _, fp8, twin = fp8_trio
    assert torch.equal(logits(fp8), logits(twin))


def test_fp8_logits_near_the_original():
    """The embedded model, quantized at load: within the measured tolerance of itself."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)"
    ids = torch.tensor([tok.encode(text).ids[:16]])
    out = []
    for quantize in (None, "fp8"):
        _, model = load_checkpoint(DEFAULT_MODEL, dtype=torch.float64, quantize=quantize)
        out.append(model.forward_train(ids)[0][0])
    ref, got = out
    err = (got - ref).abs().max().item() / ref.abs().max().item()
    p, q = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).max().item()
    assert 0 < err <= FP8_REL_TOL, f"max |dlogit| / max |logit| = {err:.4f}"
    assert kl <= FP8_KL_TOL, f"max KL {kl:.4f}"
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_quantize_at_load_equals_the_fp8_checkpoint(fp8_trio):
    original, fp8, _ = fp8_trio
    assert torch.equal(logits(original, quantize="fp8"), logits(fp8))


def test_malformed_scale_names_the_tensor(fp8_trio, tmp_path):
    _, fp8, _ = fp8_trio
    t = read_plain(fp8)
    name = "model.layers.3.self_attn.q_proj.weight_scale_inv"
    t[name] = torch.ones(1, 1)
    bad = write_checkpoint(fp8, tmp_path / "bad", t, QuantSpec().to_config())
    with pytest.raises(CheckpointError, match=r"q_proj.weight.*scale shape \(1, 1\).*\(2, 1\)"):
        load_checkpoint(bad, dtype=torch.float64)


def test_fp8_tensor_without_its_scale(fp8_trio, tmp_path):
    _, fp8, _ = fp8_trio
    t = read_plain(fp8)
    del t["model.layers.3.self_attn.q_proj.weight_scale_inv"]
    bad = write_checkpoint(fp8, tmp_path / "bad", t, QuantSpec().to_config())
    with pytest.raises(CheckpointError, match=r"without .*q_proj\.weight_scale_inv"):
        load_checkpoint(bad, dtype=torch.float64)


def test_fp8_tensors_without_quantization_config(fp8_trio, tmp_path):
    _, fp8, _ = fp8_trio
    bad = tmp_path / "bad"
    shutil.copytree(fp8, bad)
    config = json.loads((bad / "config.json").read_text())
    del config["quantization_config"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_checkpoint(bad, dtype=torch.float64)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("quant_method", "awq", "quant_method 'awq' is not supported"),
        ("fmt", "e5m2", "only 'e4m3'"),
        ("weight_block_size", [128], "two positive ints"),
        ("activation_scheme", "static", "only 'dynamic'"),
    ],
)
def test_unknown_quantization_config(fp8_trio, tmp_path, field, value, message):
    _, fp8, _ = fp8_trio
    bad = tmp_path / "bad"
    shutil.copytree(fp8, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"][field] = value
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(bad, dtype=torch.float64)


def test_quantize_option_unknown(tiny_ckpt):
    with pytest.raises(CheckpointError, match="'int4' is not supported"):
        load_checkpoint(tiny_ckpt, quantize="int4")


def test_info_counts_the_fp8_checkpoints_bytes(fp8_trio, capsys):
    """`flashlane info` on the FP8 checkpoint: its e4m3 values and scales as the file holds
    them (the tiny model's table is stored sharded, its experts one by one)."""
    _, fp8, _ = fp8_trio
    stored = read_plain(fp8)
    values = sum(t.numel() for t in stored.values() if t.dtype == torch.float8_e4m3fn)
    scales = sum(t.numel() for n, t in stored.items() if n.endswith("_scale_inv"))
    other = sum(
        t.numel()
        for n, t in stored.items()
        if t.dtype == torch.float32 and not n.endswith("_scale_inv")
    )
    counted = fp8_bytes(ModelConfig.from_hf(fp8), QuantSpec())
    assert (counted.quantized, counted.scales, counted.other) == (values, scales, other)
    nested = QuantSpec(
        not_converted=(*QuantSpec().not_converted, "model.language_model.layers.3.self_attn.q_proj")
    )
    q_proj = stored["model.layers.3.self_attn.q_proj.weight"].numel()
    assert fp8_bytes(ModelConfig.from_hf(fp8), nested).quantized == values - q_proj
    assert main(["info", str(fp8)]) == 0
    text = capsys.readouterr().out
    assert f"({counted.total_bytes:,} bytes)" in text
    assert counted.total_bytes == values + 4 * scales + 2 * counted.other


def test_quantization_flag_and_kwarg_reach_the_engine_config():
    parser = FlagParser()
    engine_flags(parser)
    opts = engine_options(parser.parse_args(["--quantization", "fp8"]))
    assert EngineConfig.resolve(**opts).quantization == "fp8"
    assert EngineConfig.resolve().quantization is None
    with pytest.raises(ValueError, match="quantization: must be fp8 or unset"):
        EngineConfig.resolve(quantization="int4")


def test_llm_quantization_kwarg_loads_fp8_values():
    """LLM(quantization="fp8") serves the quantized embedded model and generates."""
    from flashlane.lanes.records import CostTable
    from flashlane.llm import LLM
    from flashlane.request import SamplingParams

    costs = CostTable({1: 1.0, 8: 1.2}, draft_step_ms=0.3, overhead_ms=0.2)
    llm = LLM(quantization="fp8", device="cpu", max_model_len=128, max_num_seqs=1, costs=costs)
    name = "layers.0.mlp.experts.down_proj"
    served = llm.engine.model.state_dict()[name]
    _, plain = load_checkpoint(DEFAULT_MODEL, dtype=torch.float64)
    original = plain.state_dict()[name]
    q, s = quantize_blocks(original[0])
    assert torch.equal(served[0].cpu(), dequantize_blocks(q, s, served.dtype))
    assert not torch.equal(served, original.to(served.dtype))
    out = llm.generate(["def f(x):\n"], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 3

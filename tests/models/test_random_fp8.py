"""The random FP8 build (`build_random(..., quantize="fp8")`, what `bench model --random-weights
--quantization fp8` runs): the converted linears and expert stacks come out as Fp8Weight (no
plain copy kept), the rest as before; the model runs, and its logits are those of the plain
model holding the dequantized values; with ple_tables="host" its tables are marked host."""

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.models.fp8 import QuantSpec, quantize_blocks
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.host_tables import host_bytes
from flashlane.models.layers.ple import NGramEmbedding
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random, random_table_place, random_tensor


def _logits(model, cfg):
    ids = torch.randint(3, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    return model.use_kernels(REFERENCE).forward_train(ids)[0][0]


def test_random_fp8_build_yields_fp8_weights_and_runs():
    raw = preset("flashnext-tiny")
    cfg, model = build_random(raw, torch.float64, "cpu", seed=2, quantize="fp8", weights="fp8")
    kept = fp8_weights(model)
    spec = QuantSpec()
    assert "layers.0.mlp.experts.gate_proj" in kept
    assert any(n.endswith("self_attn.q_proj.weight") for n in kept)
    assert not any("mlp.gate.weight" in n or "embed_tokens" in n for n in kept)
    assert all(w.q.dtype == torch.float8_e4m3fn for w in kept.values())
    params = dict(model.named_parameters())
    for name, p in params.items():  # nothing converted is left plain
        if p.ndim == 2 and not name.endswith((".q", ".scale_inv")):
            hf = name if name.startswith(("lm_head.", "mtp.")) else "model." + name
            assert not spec.is_converted(hf), name
    # each FP8 tensor is the fp32 draw of its name, quantized
    down = kept["layers.1.mlp.experts.down_proj"]
    q, s = quantize_blocks(
        random_tensor("layers.1.mlp.experts.down_proj", down.shape, torch.float32, "cpu", 2)
    )
    assert torch.equal(down.q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(down.scale_inv, s)
    got = _logits(model, cfg)
    assert torch.isfinite(got).all()
    # the plain random model holding the same (dequantized) values gives the same logits
    _, plain = build_random(raw, torch.float64, "cpu", seed=2)
    with torch.no_grad():
        for name, w in kept.items():
            owner, _, attr = name.rpartition(".")
            getattr(plain.get_submodule(owner), attr).copy_(w.dequantize(torch.float64))
    want = _logits(plain, cfg)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * want.abs().max().item())


def test_random_build_with_host_tables():
    raw = preset("flashnext-tiny")
    cfg, model = build_random(raw, torch.float64, "cpu", seed=3, ple_tables="host")
    tables = [m for m in model.modules() if isinstance(m, NGramEmbedding)]
    assert tables and all(m.on_host for m in tables)
    assert host_bytes(model) == sum(m.ngram_embedding.weight.nbytes for m in tables)
    assert torch.isfinite(_logits(model, cfg)).all()
    assert random_table_place(raw, "cpu", "fp8", None) == "device"
    assert random_table_place(raw, "cpu", None, "cpu") == "host"


def test_fp8_weight_record_moves_with_the_model():
    _, model = build_random(
        preset("flashnext-tiny"), torch.float32, "cpu", seed=4, quantize="fp8", weights="fp8"
    )
    w = next(iter(fp8_weights(model).values()))
    assert isinstance(w, Fp8Weight) and w.device.type == "cpu"
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert total < sum(p.numel() * 4 for p in model.parameters())  # e4m3 bytes counted as 1


def test_random_fp8_on_the_cpu_is_dequantized_by_default():
    raw = preset("flashnext-tiny")
    cfg, plain = build_random(raw, torch.float64, "cpu", seed=2, quantize="fp8")
    assert not fp8_weights(plain)
    _, kept = build_random(raw, torch.float64, "cpu", seed=2, quantize="fp8", weights="fp8")
    torch.testing.assert_close(_logits(plain, cfg), _logits(kept, cfg), rtol=0, atol=1e-9)


def test_bench_model_quantized_smoke_on_cpu(tmp_path):
    from flashlane.bench.model import bench_model_main

    out = tmp_path / "r.json"
    argv = ["--config", "flashnext-tiny", "--random-weights", "--device", "cpu",
            "--quantization", "fp8", "--ple-table-device", "cpu", "--streams", "1",
            "--prefill", "64", "--decode-tokens", "3", "--json", str(out)]  # fmt: skip
    assert bench_model_main(argv) == 0
    assert '"tok_s"' in out.read_text()
    with pytest.raises(SystemExit, match="peer"):
        bench_model_main([*argv, "--peer", "transformers"])

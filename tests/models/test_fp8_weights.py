"""FP8 weights kept as FP8 (kernels/linear/fp8.py's Fp8Weight; models/fp8_weights.py): which
device keeps them, the loader's modules, and a kept model's logits equal to the dequantized
model's through the reference kernels (which dequantize the same values)."""

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.kernels.linear.fp8 import Fp8Weight, cat_rows, dense
from flashlane.models.fp8 import QuantSpec, quantize_blocks
from flashlane.models.fp8_weights import fp8_weights, weight_format
from flashlane.models.layers.norms import Stacked, linear
from flashlane.models.loader import load_checkpoint
from tests.models.test_fp8 import fp8_trio  # noqa: F401 (a fixture)


def test_weight_format_keeps_fp8_on_cuda_only():
    assert weight_format("cuda", QuantSpec()) == "fp8"
    assert weight_format("cuda:1", QuantSpec()) == "fp8"
    assert weight_format("cpu", QuantSpec()) == "dequantized"
    assert weight_format("cuda", None) == "dequantized"
    assert weight_format("cuda", QuantSpec(block=(64, 32))) == "dequantized"


def _fp8(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Fp8Weight(*quantize_blocks(torch.randn(n, k, generator=g)))


def test_fp8_weight_checks_its_grid_and_dequantizes_as_the_checkpoint():
    w = _fp8(130, 70)
    assert w.scale_inv.shape == (2, 1) and w.shape == (130, 70)
    with pytest.raises(ValueError, match="expected float32"):
        Fp8Weight(w.q, torch.ones(1, 1))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        Fp8Weight(w.q.float(), w.scale_inv)
    d = dense(w, torch.float64)
    assert torch.equal(d[:128, :], w.q[:128].double() * w.scale_inv[0, 0].double())
    assert torch.equal(d[128:, :], w.q[128:].double() * w.scale_inv[1, 0].double())


def test_stacked_fp8_linears_share_one_weight_when_blocks_align():
    a, b = linear(64, 256), linear(64, 100)
    for m, seed in ((a, 1), (b, 2)):
        del m.weight
        m.weight = _fp8(m.out_features, 64, seed)
    x = torch.randn(5, 64, dtype=torch.float64)
    alone = (a(x), b(x))
    s = Stacked(a, b)
    s.stack()
    assert isinstance(s.weight, Fp8Weight) and s.stacked(x) is not None
    assert a.weight.q.data_ptr() == s.weight.q.data_ptr()
    for got, want in zip(s(x), alone):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # a block of scales across two linears (100 rows first): they run alone
    assert cat_rows([b.weight, a.weight]) is None
    mixed = Stacked(linear(64, 128), b)
    mixed.stack()
    assert mixed.weight is None


def _logits(folder, **kw):
    cfg, model = load_checkpoint(folder, dtype=torch.float64, **kw)
    model.use_kernels(REFERENCE)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (1, 40), generator=g)
    return model, model.forward_train(ids)[0][0]


def test_kept_fp8_model_matches_the_dequantized_one(fp8_trio):  # noqa: F811
    _, fp8, _ = fp8_trio
    model, got = _logits(fp8, weights="fp8")
    kept = fp8_weights(model)
    names = set(kept)
    assert "layers.3.self_attn.q_proj.weight" in names
    assert "layers.0.mlp.experts.gate_proj" in names  # the expert stacks
    assert "layers.0.mlp.gate.weight" not in names  # the router stays in the model's dtype
    assert all(w.q.dtype == torch.float8_e4m3fn for w in kept.values())
    assert all(w.scale_inv.dtype == torch.float32 for w in kept.values())
    _, want = _logits(fp8, weights="dequantized")
    assert not fp8_weights(_logits(fp8, weights="dequantized")[0])
    # the same values through F.linear in other groupings (some stacks do not form)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * want.abs().max().item())


def test_quantize_at_load_keeps_the_fp8_checkpoints_values(fp8_trio):  # noqa: F811
    original, fp8, _ = fp8_trio
    a, b = _logits(original, quantize="fp8", weights="fp8")[0], _logits(fp8, weights="fp8")[0]
    wa, wb = fp8_weights(a), fp8_weights(b)
    assert set(wa) == set(wb)
    for n in wa:
        assert torch.equal(wa[n].q.view(torch.uint8), wb[n].q.view(torch.uint8)), n
        assert torch.equal(wa[n].scale_inv, wb[n].scale_inv), n


def test_mixed_fp8_and_plain_linears_stack_in_runs():
    """The GDN's in_proj: FP8 qkv and z beside plain b and a: two products, one a run."""
    qkv, z, b, a = linear(64, 256), linear(64, 128), linear(64, 8), linear(64, 8)
    for m, seed in ((qkv, 1), (z, 2)):
        del m.weight
        m.weight = _fp8(m.out_features, 64, seed)
    for m, seed in ((b, 3), (a, 4)):
        m.weight.data = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed)).double()
    x = torch.randn(5, 64, dtype=torch.float64)
    alone = [m(x) for m in (qkv, z, b, a)]
    s = Stacked(qkv, z, b, a)
    s.stack()
    assert [len(r.linears) for r in s.runs] == [2, 2]
    assert isinstance(s.runs[0].weight, Fp8Weight) and s.runs[1].weight is not None
    assert s.stacked(x) is None  # no one weight for all of them
    got = s(x)
    assert len(got) == 4
    for g, w in zip(got, alone):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)

"""A 3-step training smoke test on a micro config: finite, reproducible, evaluable, fast."""

import math
import time
from dataclasses import replace

import pytest
import torch

from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.layers.qsa_attention import QSAttention
from flashlane.models.loader import init_weights, load_checkpoint, save_checkpoint
from flashlane.models.rows import Rows
from training import aux_losses, data, evaluate, train_tiny


def micro_config() -> dict:
    cfg = train_tiny.tiny_config(vocab_size=512)
    cfg.update(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_value_heads=4,
        num_experts=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        hc_lowrank=8,
        ple_embed_dim=64,
        ngram_vocab_size_base=500,
        indexer_head_dim=16,
        indexer_budget=8,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["qwen_sparse_attention"],
    )
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "mrope_section": [4, 2, 2]}
    return cfg


PRESET = replace(
    train_tiny.PRESETS["cpu"], steps=3, batch_size=2, seq_len=64, warmup=1, log_every=1
)


def _stream() -> torch.Tensor:
    return torch.randint(1, 512, (2000,), generator=torch.Generator().manual_seed(1))


def test_tiny_config_is_valid_and_small():
    cfg = ModelConfig.from_hf(train_tiny.tiny_config())
    assert cfg.hc_count == 4 and cfg.ple_layer_ids == (1,) and cfg.num_mtp_layers == 1
    assert cfg.layer_types.count("linear") >= 3 and cfg.layer_types.count("sparse") >= 2
    assert cfg.indexer_budget + cfg.indexer_block < train_tiny.PRESETS["cpu"].seq_len
    assert cfg.max_position_embeddings >= 8192


@pytest.fixture
def one_thread():
    # Tiny ops on two threads of a 2-core machine another process keeps busy can run 100x
    # slower (each parallel region waits for a descheduled thread): train on one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_three_steps_are_finite_reproducible_and_fast(tmp_path, one_thread):
    t0 = time.perf_counter()
    logs: list[dict] = []
    model, summary = train_tiny.train(micro_config(), _stream(), PRESET, seed=3, log=logs.append)
    _, again = train_tiny.train(micro_config(), _stream(), PRESET, seed=3, log=lambda e: None)
    assert time.perf_counter() - t0 < 20
    assert summary["steps"] == 3 and [e["step"] for e in logs] == [1, 2, 3]
    assert math.isfinite(summary["train_main"]) and math.isfinite(summary["train_mtp"])
    assert summary["train_main"] == again["train_main"]
    assert summary["train_mtp"] == again["train_mtp"]
    result = evaluate.evaluate(model, data.windows(_stream(), 64), max_windows=4)
    assert math.isfinite(result["main_loss"]) and math.isfinite(result["mtp_loss"])
    assert 0 <= result["mtp_accept_depth1"] <= 1 and result["num_tokens"] == 4 * 64
    # The checkpoint the script writes loads back with the same losses.
    save_checkpoint(model, micro_config(), tmp_path)
    _, loaded = load_checkpoint(tmp_path)
    assert evaluate.evaluate(loaded, data.windows(_stream(), 64), max_windows=4) == result


def test_windows_and_order_are_deterministic():
    w = data.windows(torch.arange(100), 8)
    assert w.shape == (12, 10) and w[1, 0] == 8 and w[0, -1] == 9
    a = [b.tolist() for _, b in zip(range(5), data.batch_order(11, 4, seed=7))]
    b = [b.tolist() for _, b in zip(range(5), data.batch_order(11, 4, seed=7))]
    assert a == b and all(len(x) == 4 for x in a)
    assert sorted(a[0] + a[1]) == sorted(set(a[0] + a[1]))


def test_lr_schedule():
    p = replace(PRESET, steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert train_tiny.lr_at(0, p) == 0.1 and train_tiny.lr_at(9, p) == 1.0
    assert abs(train_tiny.lr_at(99, p) - 0.1) < 1e-3
    assert all(train_tiny.lr_at(s, p) >= train_tiny.lr_at(s + 1, p) for s in range(10, 99))


def test_chained_acceptance_hook():
    docs = [list(range(40))]
    # A drafter that always agrees with the greedy target for 2 tokens, then misses.
    greedy = lambda prefix, n: [len(prefix) + i for i in range(n)]  # noqa: E731
    drafter = lambda prefix, depth: [len(prefix) + 1, len(prefix) + 2, -1, -1][:depth]  # noqa: E731
    rates = evaluate.chained_acceptance(drafter, greedy, docs, max_depth=4, stride=8)
    assert rates == {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}


def _qsa_layer_and_input(t: int):
    cfg = micro_config()
    model = FlashNext(ModelConfig.from_hf(cfg))
    init_weights(model, 5)
    attn = next(m for m in model.modules() if isinstance(m, QSAttention))
    ids = torch.randint(0, 512, (2, t), generator=torch.Generator().manual_seed(2))
    x = torch.randn(2 * t, cfg["hidden_size"], generator=torch.Generator().manual_seed(3))
    return model, attn, Rows.training(ids), x


def test_dense_probs_match_the_layer_while_attention_is_dense():
    # With at most top_blocks complete blocks the layer attends densely: the hook's q/k
    # recomputation must give the layer's own output.
    model, attn, rows, x = _qsa_layer_and_input(t=8)
    cfg = attn.cfg
    probs = aux_losses.dense_probs(attn, x, rows, model.rotary)  # [B, Hq, T, T]
    v = attn.v_proj(x).reshape(2, 8, cfg.num_kv_heads, cfg.head_dim)
    v = v.repeat_interleave(cfg.num_attention_heads // cfg.num_kv_heads, dim=2)
    o = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(16, -1)
    gate = attn.q_proj(x).reshape(16, cfg.num_attention_heads, 2, cfg.head_dim)[:, :, 1]
    want = attn.o_proj(o * torch.sigmoid(gate.reshape(16, -1)))
    got = attn(x, rows, model.rotary, model.kernels)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_indexer_kl_trains_only_the_indexer():
    model, attn, rows, x = _qsa_layer_and_input(t=40)
    x.requires_grad_(True)
    kl = aux_losses.indexer_kl(attn, x, rows, model.rotary)
    assert kl.item() > 0
    kl.backward()
    assert x.grad is None
    for name, p in attn.named_parameters():
        assert (p.grad is not None and p.grad.abs().sum() > 0) == name.startswith("indexer."), name

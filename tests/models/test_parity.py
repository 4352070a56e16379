"""Our forward against transformers 5.17 (fp32, every parameter random): qwen4_exp (two
configs) and its siblings qwen3_next, qwen3_5 and qwen3_5_moe."""

import json

import pytest
import torch

from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from tests.oracle import SIBLINGS, hf_classes, lower_id_ties

TOL = 1e-4  # relative to the largest |logit|


@pytest.fixture(scope="module", params=["tiny", "other", *sorted(SIBLINGS)])
def checkpoint(request, oracle_by_name):
    """The two qwen4_exp checkpoints, then each sibling family's."""
    return oracle_by_name(request.param)


@pytest.fixture(scope="module")
def pair(checkpoint):
    model_type = json.loads((checkpoint / "config.json").read_text())["model_type"]
    hf = hf_classes(model_type)[0].from_pretrained(checkpoint, dtype=torch.float32).eval()
    cfg, ours = load_checkpoint(checkpoint, dtype=torch.float64)
    return hf, cfg, ours


def prompt(cfg, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, cfg.vocab_size, (n,), generator=g)
    ids[n // 3] = ids[n // 2] = cfg.eos_token_ids[0]  # EOS inside: PLE n-grams restart
    return ids


def oracle_logits(hf, ids):
    with torch.no_grad(), lower_id_ties():
        return hf(ids.unsqueeze(0)).logits[0].double()


def assert_close(ours, ref):
    err = (ours.double() - ref).abs().max().item()
    assert err <= TOL * ref.abs().max().item(), f"max error {err:.3g}"


def session(cfg, capacity=512):
    return SessionState.empty(cfg, capacity, torch.float64, torch.float64)


def test_full_prompt(pair):
    hf, cfg, ours = pair
    ids = prompt(cfg, 150)  # sparse attention past position 11 (tiny) / 15 (other)
    logits, _ = ours.forward_train(ids.unsqueeze(0))
    assert_close(logits[0], oracle_logits(hf, ids))


def test_prefill_pieces_then_one_token_steps(pair):
    hf, cfg, ours = pair
    ids = prompt(cfg, 170, seed=1)
    s = session(cfg)
    out = [
        run_piece(ours, s, ids[a:b], a, recurrent=False)
        for a, b in ((0, 64), (64, 128), (128, 150))
    ]
    out += [run_piece(ours, s, ids[p : p + 1], p, recurrent=True) for p in range(150, 170)]
    assert_close(torch.cat(out), oracle_logits(hf, ids))


def test_uneven_pieces_and_windows(pair):
    hf, cfg, ours = pair
    ids = prompt(cfg, 130, seed=2)
    s, out, a = session(cfg), [], 0
    for n, rec in ((37, False), (50, False), (1, True), (5, True), (23, False), (14, True)):
        out.append(run_piece(ours, s, ids[a : a + n], a, recurrent=rec))
        a += n
    assert_close(torch.cat(out), oracle_logits(hf, ids[:a]))


def test_greedy_continuation_equals_oracle(pair):
    hf, cfg, ours = pair
    ids = prompt(cfg, 40, seed=3)
    with torch.no_grad(), lower_id_ties():
        ref = hf.generate(
            ids.unsqueeze(0), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, 40:].tolist()
    s = session(cfg)
    logits = run_piece(ours, s, ids, 0, recurrent=False)
    got = []
    for p in range(40, 72):
        got.append(int(logits[-1].argmax()))
        logits = run_piece(ours, s, torch.tensor(got[-1:]), p, recurrent=True)
    assert got == ref

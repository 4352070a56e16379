"""The graphed layer split (runner/graphed_blocks.py, Flash Next's through runner/trunk.py's
layer: hyper-connection read and the mixer's projections | mixer | output and MLP half; for
verify windows of one width also the PLE and the GDN conv) computes what the plain layer does,
bit for bit. On the CPU a stand-in for
runner.graphs.Graphs calls each part on static buffers that it poisons between calls;
tests/gpu checks the real CUDA graphs."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.graphed_blocks import graphed_block
from flashlane.runner.graphs import bucket_of, buckets, run_all_parts
from tests.oracle import GATE_CHECKPOINTS


class CallThrough:
    """Graphs' interface without graphs, its memory as strict as a replay's: each (key,
    bucket, shapes) has static inputs and outputs that every call reuses, the rows past the
    call's keep what an earlier call left there, and the first `views` outputs are views of
    the static outputs, the rest copies. Graphs share one pool, so a replay may write over
    any graph's outputs: every call here fills all static outputs with NaN before it
    computes, and a view used after the next call shows it. Every part is counted."""

    def __init__(self):
        self.keys, self.sizes, self.static = set(), buckets(64), {}

    def run(self, key, fn, *args, views=0):
        self.keys.add(key[1])
        rows = args[0].shape[0]
        size = bucket_of(rows, self.sizes)
        if size is None:
            return fn(*args)
        full = (*key, size, *(tuple(a.shape[1:]) for a in args))
        if full not in self.static:
            ins = [a.new_zeros((size, *a.shape[1:])) for a in args]
            self.static[full] = (ins, [o.clone() for o in fn(*ins)])
        ins, outs = self.static[full]
        for s, a in zip(ins, args):
            s[:rows].copy_(a)
        for _, others in self.static.values():
            for o in others:
                if o.is_floating_point():
                    o.fill_(float("nan"))
        for s, o in zip(outs, fn(*ins)):
            s.copy_(o)
        return tuple(o[:rows] if i < views else o[:rows].clone() for i, o in enumerate(outs))

    def block(self, layer, x, rows, rotary, kernels):
        return graphed_block(layer, x, rows, rotary, kernels, self)


def test_buckets():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert [bucket_of(n, buckets(64)) for n in (1, 3, 16, 17, 64, 65)] == [1, 4, 16, 32, 64, None]


def _pieces(model, s: SessionState, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a 30-token prompt, four one-row windows and two of three rows, committed."""
    prompt = run_piece(model, s, ids[:30], 0, recurrent=False)
    steps = [run_piece(model, s, ids[i : i + 1], i, recurrent=True) for i in range(30, 34)]
    wide = [run_piece(model, s, ids[i : i + 3], i, recurrent=True) for i in (34, 37)]
    return torch.cat([prompt, *steps, *wide])


def test_split_layer_equals_plain_layer(oracle_ckpt):
    cfg, model = load_checkpoint(oracle_ckpt, dtype=torch.float64)
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(3))
    outs = []
    for graphs in (None, CallThrough()):
        model.graphs = graphs
        s = SessionState.empty(cfg, 64, torch.float64, torch.float64)
        outs.append(_pieces(model, s, ids))
    model.graphs = None
    assert graphs.keys == {"read", "mlp", "conv"} | ({"ple"} if cfg.ple_layer_ids else set())
    assert torch.equal(outs[0], outs[1])


def test_sibling_split_block_equals_plain_block(sibling_ckpt):
    """A sibling's block (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) split the same way: "read",
    "mlp" and, for windows of one width, the GDN's "conv", bit for bit the plain block; its
    MTP head's block too (a draft step replays it)."""
    cfg, model = load_checkpoint(sibling_ckpt, dtype=torch.float64)
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(4))
    outs, heads = [], []
    for graphs in (None, CallThrough()):
        model.graphs = graphs
        s = SessionState.empty(cfg, 64, torch.float64, torch.float64)
        outs.append(_pieces(model, s, ids))
        rows = Rows.of([(s, ids[:8], 0, False)], "cpu")
        hidden = torch.randn(8, cfg.hidden_size, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(5))  # fmt: skip
        embed = model.embed_tokens(ids[1:9])
        heads.append(model.mtp(hidden, embed, rows, model.rotary, model.kernels, graphs)[0])
    model.graphs = None
    assert graphs.keys == {"read", "mlp", "conv"}
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(heads[0], heads[1])


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_engine_with_strict_parts_keeps_replies(oracle_by_name, name):
    """The engine's rounds (prompt pieces, drafted windows, MTP steps, commits) through the
    strict stand-in: batched and drafted replies equal each alone and undrafted. A part's
    view used past another part's call (a recorded conv input, say) would read NaN."""
    costs = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, draft_step_ms=0.3, overhead_ms=0.2)
    llm = LLM(str(oracle_by_name(name)), costs=costs, parallel=6, max_rows=16)
    llm.engine.model.graphs = parts = CallThrough()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 70, 17, 9, 33, 3)]
    params = [SamplingParams(max_tokens=16, temperature=0.0, draft=i % 3 != 1) for i in range(6)]
    together = llm.generate(prompts, params)
    assert parts.keys >= {"read", "mlp", "conv"}
    for prompt, p, got in zip(prompts, params, together):
        alone = llm.generate(prompt, dataclasses.replace(p, draft=False))[0]
        assert got.error is None and got.token_ids == alone.token_ids


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_start_up_parts_cover_every_decode_round(oracle_by_name, name):
    """capture_all's calls (runner.graphs.run_all_parts) name the parts, keys and shapes
    the rounds then run: after them, an engine's rounds (drafting on and off) meet no new
    part but the conv and PLE of prompt pieces and of windows wider than one row, which
    are captured when first met."""
    costs = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, draft_step_ms=0.3, overhead_ms=0.2)
    llm = LLM(str(oracle_by_name(name)), costs=costs, parallel=4, max_rows=16)
    model = llm.engine.model
    model.graphs = parts = CallThrough()
    run_all_parts(model, parts)
    started = set(parts.static)
    assert {k[1] for k in started} >= {"read", "mlp", "conv"}
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 40, 12)]
    for draft in (False, True):
        llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, draft=draft))
    model.graphs = None
    for key in set(parts.static) - started:
        assert key[1] in ("conv", "ple") and key[3][0] > 1, key  # [B, T>1, ...] windows

"""The graphed layer split (hyper-connection read and the mixer's projections | mixer | output
and MLP half; for verify windows of one width also the PLE and the GDN conv) computes what the
plain layer does, bit for bit. On the CPU a stand-in for
runner.graphs.Graphs calls each part directly; tests/gpu checks the real CUDA graphs."""

import torch

from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.runner.graphs import bucket_of, buckets


class CallThrough:
    """Graphs' interface without graphs: every part runs as called (and is counted), its rows
    padded to the bucket the way a replay pads them (with zeros here, as at capture)."""

    def __init__(self):
        self.keys, self.sizes = set(), buckets(64)

    def run(self, key, fn, *args, views=0):
        self.keys.add(key[1])
        rows = args[0].shape[0]
        size = bucket_of(rows, self.sizes)
        if size is None:
            return fn(*args)
        padded = [torch.cat([a, a.new_zeros((size - rows, *a.shape[1:]))]) for a in args]
        return tuple(o[:rows] for o in fn(*padded))


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

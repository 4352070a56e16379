"""The graphed layer split (hyper-connection read and GDN projections | mixer | GDN output and
MLP half) computes what the plain layer does, bit for bit. On the CPU a stand-in for
runner.graphs.Graphs calls each part directly; tests/gpu checks the real CUDA graphs."""

import torch

from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState


class CallThrough:
    """Graphs' interface, without graphs: every part runs as called (and is counted)."""

    def __init__(self):
        self.keys = set()

    def run(self, key, fn, *args):
        self.keys.add(key[1])
        return fn(*args)


def test_split_layer_equals_plain_layer(oracle_ckpt):
    cfg, model = load_checkpoint(oracle_ckpt, dtype=torch.float64)
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(3))
    outs = []
    for graphs in (None, CallThrough()):
        model.graphs = graphs
        s = SessionState.empty(cfg, 64, torch.float64, torch.float64)
        prompt = run_piece(model, s, ids[:30], 0, recurrent=False)
        steps = [run_piece(model, s, ids[i : i + 1], i, recurrent=True) for i in range(30, 40)]
        outs.append(torch.cat([prompt, *steps]))
    model.graphs = None
    assert graphs.keys == {"read", "mlp"}
    assert torch.equal(outs[0], outs[1])

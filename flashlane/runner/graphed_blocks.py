"""The shared rounds' blocks through CUDA graphs (runner/graphs.py replays them).

A block's parts that depend on the row count alone are the layers' named parts composed into
functions of tensors (runner/parts.py); `graphed_block` runs a block as those replays with
what reads or writes session state (the recurrent rule, the caches, the indexer, the conv and
PLE records) eager between them. The model files know no graphs: a block given `graphs` calls
`graphs.block(layer, ...)`, which lands here (tests/models/test_graph_split.py runs this
composition on the CPU through a strict stand-in for Graphs; tests/gpu replays it).

Flash Next's block is runner/trunk.py's `layer`, the device steps' too, with `Recorded` as
its state. A sibling's block (models/layers/plain_decoder.py) is composed here
(`_plain_block`): "read", the mixer, "mlp", and for B verify windows of one width T the
GDN's "conv".
"""

from __future__ import annotations

import torch

from flashlane.kernels import Kernels
from flashlane.models.layers.plain_decoder import PlainDecoderLayer
from flashlane.models.rows import Rows
from flashlane.runner import trunk
from flashlane.runner.parts import block_parts

__all__ = ["Recorded", "graphed_block"]


def graphed_block(layer, r: torch.Tensor, rows: Rows, rotary, kernels: Kernels, graphs):
    """The block's forward (the residual after it) with its row-count-only parts replayed
    by `graphs` (runner.graphs.Graphs, or a stand-in with its run())."""
    if isinstance(layer, PlainDecoderLayer):
        return _plain_block(layer, r, rows, rotary, kernels, graphs)
    return trunk.layer(layer, None, r, None, Recorded(rows, rotary, graphs), kernels)[0]


class Recorded:
    """The shared rounds' session state for runner/trunk.py's `layer`: the mixers read each
    piece's session state (stacked where pieces stack) and record what commit() needs in
    the piece (models/flashnext.py's commit); each part replays through `graphs` (its run).
    When the rows are B verify windows of one width T (rows.one_width), the PLE and the GDN
    conv replay too, on [B, T] inputs with the sessions' windows. A layer's modules know
    their own state: the layer index is not read."""

    def __init__(self, rows: Rows, rotary, graphs):
        self.rows, self.rotary, self.run = rows, rotary, graphs.run
        self.width = rows.one_width()  # the windows' one width T, or None

    def cos_sin(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows.cos_sin(self.rotary, dtype)

    def ple(self, idx, layer, r: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """r plus the layer's PLE addition: its "ple" part for windows of one width."""
        rows, ple, t = self.rows, layer.ple, self.width
        if t is None:
            return r + ple(r, rows, kernels)
        pieces, b = rows.pieces, len(rows.pieces)
        hist = ple.history(pieces, rows.token_ids.view(b, t))
        part = block_parts(layer, kernels)["ple"]
        r3, xfull = self.run((id(layer), "ple"), part, r.view(b, t, -1), hist,
                             ple.window_of(pieces))  # fmt: skip
        ple.record(pieces, xfull, hist)
        return r3.flatten(0, 1)

    def attend(self, idx, attn, q, k, v, iq, raw, kernels: Kernels) -> torch.Tensor:
        return attn.attend(q, k, v, iq, raw, self.rows, self.rotary, kernels)

    def gdn(self, idx, gdn, qkv, gate_a, gate_b, kernels: Kernels) -> torch.Tensor:
        return gdn.mix(qkv, gate_a, gate_b, self.rows, kernels)

    def windows(self, gdn) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The sessions' conv windows and recurrent states, stacked, when the rows are
        windows of one width (the "conv" part reads the windows), else None."""
        if self.width is None:
            return None
        return gdn.state_of([p.session for p in self.rows.pieces])

    def rule(self, gdn, q, k, v, gate_a, gate_b, xfull, recurrent, kernels: Kernels):
        """The recurrent rule over the windows from their states -> o [B*T, HV, Dv]; the
        conv inputs and the state after each row recorded."""
        gates = gdn.gates(gate_a, gate_b)  # computed in the rule's programs
        o, states = kernels.recurrent_gdn(q, k, v, None, None, recurrent, gates=gates)
        gdn.record(self.rows.pieces, xfull, states)
        return o.flatten(0, 1)


def _plain_block(layer, h, rows: Rows, rotary, kernels: Kernels, graphs) -> torch.Tensor:
    """A sibling's block with everything but the mixer's use of session state replayed;
    B verify windows of one width T (rows.one_width) also replay the GDN conv."""
    parts, key = block_parts(layer, kernels), id(layer)
    if layer.kind != "linear":
        cos, sin = rows.cos_sin(rotary, h.dtype)
        q, gate, k, v = graphs.run((key, "read"), parts["read"], h, cos, sin, views=4)
        o = layer.self_attn.attend(q, k, v, rows, kernels)
        return graphs.run((key, "mlp"), parts["mlp"], h, o, gate)[0]
    gdn, t = layer.linear_attn, rows.one_width()
    if t is None:
        qkv, a, b, z = graphs.run((key, "read"), parts["read"], h, views=4)
        o = gdn.mix(qkv, a, b, rows, kernels)
        return graphs.run((key, "mlp"), parts["mlp"], h, o, z)[0]
    state = Recorded(rows, rotary, graphs)
    window, recurrent = state.windows(gdn)
    z, a, b, q, k, v, xfull = graphs.run(
        (key, "conv"), parts["conv"], h.view(len(rows.pieces), t, -1), window, views=6
    )
    o = state.rule(gdn, q, k, v, a, b, xfull, recurrent, kernels)
    return graphs.run((key, "mlp"), parts["mlp"], h, o, z.flatten(0, 1))[0]

"""The shared rounds' blocks through CUDA graphs (runner/graphs.py replays them).

A block's parts that depend on the row count alone are the layers' named parts composed into
functions of tensors (runner/parts.py); `graphed_block` runs a block as those replays with
what reads or writes session state (the recurrent rule, the caches, the indexer, the conv and
PLE records) eager between them. The model files know no graphs: a block given `graphs` calls
`graphs.block(layer, ...)`, which lands here (tests/models/test_graph_split.py runs this
composition on the CPU through a strict stand-in for Graphs; tests/gpu replays it).
"""

from __future__ import annotations

import torch

from flashlane.kernels import Kernels
from flashlane.models.layers.plain_decoder import PlainDecoderLayer
from flashlane.models.rows import Rows
from flashlane.runner.parts import block_parts

__all__ = ["graphed_block"]


def graphed_block(layer, r: torch.Tensor, rows: Rows, rotary, kernels: Kernels, graphs):
    """The block's forward (the residual after it) with its row-count-only parts replayed
    by `graphs` (runner.graphs.Graphs, or a stand-in with its run())."""
    if isinstance(layer, PlainDecoderLayer):
        return _plain_block(layer, r, rows, rotary, kernels, graphs)
    return _flashnext_block(layer, r, rows, rotary, kernels, graphs)


def _flashnext_block(layer, r, rows: Rows, rotary, kernels: Kernels, graphs) -> torch.Tensor:
    """Everything but the mixer's use of session state replayed. When the rows are B verify
    windows of one width T (rows.one_width), the PLE and the GDN conv replay too, on [B, T]
    inputs with the sessions' windows."""
    parts, t, key = block_parts(layer, kernels), rows.one_width(), id(layer)
    ple = layer.ple
    if ple is not None and t is not None:
        b, pieces = len(rows.pieces), rows.pieces
        hist = ple.history(pieces, rows.token_ids.view(b, t))
        r3, xfull = graphs.run((key, "ple"), parts["ple"], r.view(b, t, -1), hist,
                               ple.window_of(pieces))  # fmt: skip
        ple.record(pieces, xfull, hist)
        r = r3.flatten(0, 1)
    elif ple is not None:
        r = r + ple(r, rows, kernels)
    if layer.kind != "linear":
        cos, sin = rows.cos_sin(rotary, r.dtype)
        w, q, gate, k, v, iq, raw = graphs.run((key, "read"), parts["read"], r, cos, sin, views=7)
        o = layer.self_attn.attend(q, k, v, iq, raw, rows, rotary, kernels)
        return graphs.run((key, "mlp"), parts["mlp"], r, o, gate, w)[0]
    gdn = layer.linear_attn
    if t is None:
        w, qkv, gate_a, gate_b, z = graphs.run((key, "read"), parts["read"], r, views=5)
        o = gdn.mix(qkv, gate_a, gate_b, rows, kernels)
        return graphs.run((key, "mlp"), parts["mlp"], r, o, z, w)[0]
    b = len(rows.pieces)
    window, state = gdn.state_of([p.session for p in rows.pieces])
    w, z, gate_a, gate_b, q, k, v, xfull = graphs.run(
        (key, "conv"), parts["conv"], r.view(b, t, -1), window, views=7
    )
    gates = gdn.gates(gate_a, gate_b)  # computed in the rule's programs
    o, states = kernels.recurrent_gdn(q, k, v, None, None, state, gates=gates)
    gdn.record(rows.pieces, xfull, states)
    flat = (x.flatten(0, 1) for x in (o, z, w))
    return graphs.run((key, "mlp"), parts["mlp"], r, *flat)[0]


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
    n = len(rows.pieces)
    window, state = gdn.state_of([p.session for p in rows.pieces])
    z, a, b, q, k, v, xfull = graphs.run(
        (key, "conv"), parts["conv"], h.view(n, t, -1), window, views=6
    )
    o, states = kernels.recurrent_gdn(q, k, v, None, None, state, gates=gdn.gates(a, b))
    gdn.record(rows.pieces, xfull, states)
    return graphs.run((key, "mlp"), parts["mlp"], h, o.flatten(0, 1), z.flatten(0, 1))[0]

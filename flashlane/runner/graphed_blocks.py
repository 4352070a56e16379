"""The shared rounds' blocks through CUDA graphs (runner/graphs.py replays them).

A block's parts that depend on the row count alone are the layers' named parts composed into
functions of tensors (`block_parts`); `graphed_block` runs a block as those replays with what
reads or writes session state (the recurrent rule, the caches, the indexer, the conv and PLE
records) eager between them. The model files know no graphs: a block given `graphs` calls
`graphs.block(layer, ...)`, which lands here (tests/models/test_graph_split.py runs this
composition on the CPU through a strict stand-in for Graphs; tests/gpu replays it).

Flash Next's block (models/layers/decoder.py): "read" (r, cos, sin -> the write weights and
the attention's row-wise projections; GDN: r -> the write weights and the input projections),
"mlp" (the mixer's output -> the residual after the block), for B verify windows of one width
T the GDN's "conv" (r [B, T, hc*H], the conv windows -> the write weights, the output gate,
the gates' inputs a and b, q, k, v after the conv and norms, the conv inputs) and a PLE
layer's "ple" (r3, ids, conv window -> r3 + PLE, the conv inputs). A sibling's block
(models/layers/plain_decoder.py): "read" (the norm and the mixer's projections), "mlp" and
the GDN's "conv", without write weights.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.layers.plain_decoder import PlainDecoderLayer
from flashlane.models.rows import Rows

__all__ = ["block_parts", "graphed_block"]

# per layer, the parts for the kernels in use: made once (a replay never calls them)
_PARTS: weakref.WeakKeyDictionary[nn.Module, tuple[Kernels, dict]] = weakref.WeakKeyDictionary()


def graphed_block(layer, r: torch.Tensor, rows: Rows, rotary, kernels: Kernels, graphs):
    """The block's forward (the residual after it) with its row-count-only parts replayed
    by `graphs` (runner.graphs.Graphs, or a stand-in with its run())."""
    if isinstance(layer, PlainDecoderLayer):
        return _plain_block(layer, r, rows, rotary, kernels, graphs)
    return _flashnext_block(layer, r, rows, rotary, kernels, graphs)


def block_parts(layer, kernels: Kernels) -> dict:
    """The block's parts (module docstring) for these kernels, made once."""
    held = _PARTS.get(layer)
    if held is None or held[0] is not kernels:
        make = _plain_parts if isinstance(layer, PlainDecoderLayer) else _flashnext_parts
        held = _PARTS[layer] = (kernels, make(layer, kernels))
    return held[1]


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


def _flashnext_parts(layer, kernels: Kernels) -> dict:
    out = {}
    if layer.ple is not None:

        def ple(r3, history, window):
            add, xfull = layer.ple.stacked(r3, history, window, kernels)
            return r3 + add, xfull

        out["ple"] = ple
    if layer.kind != "linear":
        attn = layer.self_attn

        def read_attn(r, cos, sin):
            a, w = layer.attn_hyper_connection.read(r)
            return (w, *attn.project(a, cos, sin))

        def mlp_attn(r, o, gate, w):
            return (layer.mlp_half(r, attn.output(o, gate), w, kernels),)

        return {**out, "read": read_attn, "mlp": mlp_attn}
    gdn = layer.linear_attn

    def read(r):
        a, w = layer.attn_hyper_connection.read(r)
        return (w, *gdn.project(a))

    def conv(r3, window):
        b, t = r3.shape[:2]
        w, qkv, gate_a, gate_b, z = (x.unflatten(0, (b, t)) for x in read(r3.flatten(0, 1)))
        q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
        return w, z, gate_a, gate_b, q, k, v, xfull

    def mlp(r, o, z, w):
        return (layer.mlp_half(r, gdn.finish(o, z), w, kernels),)

    return {**out, "read": read, "conv": conv, "mlp": mlp}


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


def _plain_parts(layer, kernels: Kernels) -> dict:
    if layer.kind != "linear":
        attn = layer.self_attn

        def read_attn(h, cos, sin):
            return attn.project(layer.input_layernorm(h), cos, sin)

        def mlp_attn(h, o, gate):
            return (layer.mlp_half(h + attn.output(o, gate), kernels),)

        return {"read": read_attn, "mlp": mlp_attn}
    gdn = layer.linear_attn

    def read(h):
        return gdn.project(layer.input_layernorm(h))

    def conv(h3, window):
        b, t = h3.shape[:2]
        qkv, a, bb, z = (x.unflatten(0, (b, t)) for x in read(h3.flatten(0, 1)))
        q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
        return z, a, bb, q, k, v, xfull

    def mlp(h, o, z):
        return (layer.mlp_half(h + gdn.finish(o, z), kernels),)

    return {"read": read, "conv": conv, "mlp": mlp}

"""The layers' named parts: functions of tensors alone, made once per layer, that the shared
rounds replay through CUDA graphs (runner/graphs.py) and a device step calls as they are.

Flash Next's layer (models/layers/decoder.py; runner/trunk.py composes it): "read" (r, cos,
sin -> the write weights and the attention's row-wise projections; GDN: r -> the write
weights and the input projections; either given xn, r's norm that the write before made),
"mlp" (the mixer's output -> the residual after the layer; given `then`, the hyper-connection
that reads it next, also then's norm of it from the last write's launch), for B verify
windows of one width T the GDN's "conv" (r [B, T, hc*H], the conv windows -> the write
weights, the output gate, the gates' inputs a and b, q, k, v after the conv and norms, the
conv inputs) and a PLE layer's "ple" (r3, ids, conv window -> r3 + PLE, the conv inputs). A
sibling's block (models/layers/plain_decoder.py; runner/graphed_blocks.py composes it):
"read" (the norm and the mixer's projections), "mlp" and the GDN's "conv", without write
weights.
"""

from __future__ import annotations

import weakref

from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.layers.plain_decoder import PlainDecoderLayer

__all__ = ["block_parts"]

# per layer, the parts for the kernels in use: made once (a replay never calls them)
_PARTS: weakref.WeakKeyDictionary[nn.Module, tuple[Kernels, dict]] = weakref.WeakKeyDictionary()


def block_parts(layer, kernels: Kernels) -> dict:
    """The layer's parts (module docstring) for these kernels, made once."""
    held = _PARTS.get(layer)
    if held is None or held[0] is not kernels:
        make = _plain_parts if isinstance(layer, PlainDecoderLayer) else _flashnext_parts
        held = _PARTS[layer] = (kernels, make(layer, kernels))
    return held[1]


def _flashnext_parts(layer, kernels: Kernels) -> dict:
    out, hc = {}, layer.attn_hyper_connection
    if layer.ple is not None:

        def ple(r3, history, window):
            add, xfull = layer.ple.stacked(r3, history, window, kernels)
            return r3 + add, xfull

        out["ple"] = ple

    def mlp_half(r, y, w, then):
        # (the residual,) or with `then` (the residual, then's norm of it)
        out = layer.mlp_half(r, y, w, kernels, then)
        return (out,) if then is None else out

    if layer.kind != "linear":
        attn = layer.self_attn

        def read_attn(r, cos, sin, xn=None):
            a, w = hc.read(r, xn)
            return (w, *attn.project(a, cos, sin))

        def mlp_attn(r, o, gate, w, then=None):
            return mlp_half(r, attn.output(o, gate), w, then)

        return {**out, "read": read_attn, "mlp": mlp_attn}
    gdn = layer.linear_attn

    def read(r, xn=None):
        a, w = hc.read(r, xn)
        return (w, *gdn.project(a))

    def conv(r3, window):
        b, t = r3.shape[:2]
        w, qkv, gate_a, gate_b, z = (x.unflatten(0, (b, t)) for x in read(r3.flatten(0, 1)))
        q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
        return w, z, gate_a, gate_b, q, k, v, xfull

    def mlp(r, o, z, w, then=None):
        return mlp_half(r, gdn.finish(o, z), w, then)

    return {**out, "read": read, "conv": conv, "mlp": mlp}


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

"""The target's layer written once: the shared rounds' blocks (runner/graphed_blocks.py) and
the lone driver's device steps (runner/lone_step.py's plain steps, runner/draft_step.py's
drafted ones, through `layers`) all run `layer`.

A layer is its named parts (runner/parts.py: functions of tensors alone) with the mixer's
use of session state between them: a PLE layer's addition, "read" (the hyper-connection read
and the mixer's row-wise projections), the mixer (attention over the sessions' caches; the
GDN's conv and recurrent rule), "mlp" (the mixer's output, its write, the MLP half). Every op
is the same kernel call on the same rows on every path, so the bits are the same. The paths
differ only in where a mixer's session state goes and how a part runs, which the `state`
says:

- `Recorded` (runner/graphed_blocks.py: the shared rounds): each piece's state read where
  it lies and what commit() needs recorded in the piece; every part replayed through a CUDA
  graph (`run` is graphs.run). When the rows are B verify windows of one width, the PLE and
  the GDN's conv replay too, with the sessions' windows stacked as inputs (`windows`: the
  conv is then one part with the read, "conv").
- `InPlace` and `Windowed` (runner/lone_state.py: a plain and a drafted device step): state
  read and written where it lies, or kept per row until the step's commit; parts called as
  they are (the step is one CUDA graph).

A device step also makes each read's norm in the launch of the write before it (xn, `then`:
the same bits as the read's own norm); the shared rounds' model hands a block the residual
alone, so their reads make their own.
"""

from __future__ import annotations

from functools import partial

import torch

from flashlane.kernels import Kernels
from flashlane.models.flashnext import FlashNext
from flashlane.runner.parts import block_parts

__all__ = ["embedded", "layer", "layers"]


def layer(decoder, idx: int | None, r, xn, state, kernels: Kernels, then=None) -> tuple:
    """A Flash Next layer (models/layers/decoder.py's `decoder`, index idx in the sessions'
    state) over the rows r [N, hc*H] -> (the residual after it, then's norm of it or None).
    xn: r's norm where the write before made it (None: the read makes it; always before a
    PLE layer, which adds to the streams first); state: `Recorded`, `InPlace` or `Windowed`
    (module docstring); then: the hyper-connection that reads the result next, whose norm
    the last write makes."""
    parts, key, run = block_parts(decoder, kernels), id(decoder), state.run
    norm = () if xn is None else (xn,)
    if decoder.ple is not None:
        r = state.ple(idx, decoder, r, kernels)
    if decoder.kind != "linear":
        cos, sin = state.cos_sin(r.dtype)
        w, q, gate, k, v, iq, raw = run((key, "read"), parts["read"], r, cos, sin, *norm, views=7)
        mixed = state.attend(idx, decoder.self_attn, q, k, v, iq, raw, kernels), gate
    elif (stacked := state.windows(decoder.linear_attn)) is None:
        w, qkv, gate_a, gate_b, z = run((key, "read"), parts["read"], r, *norm, views=5)
        mixed = state.gdn(idx, decoder.linear_attn, qkv, gate_a, gate_b, kernels), z
    else:  # the shared rounds' B windows of T rows (xn None): the conv replays with the read
        window, recurrent = stacked
        r3 = r.view(window.shape[0], -1, r.shape[-1])
        w, z, gate_a, gate_b, q, k, v, xfull = run(
            (key, "conv"), parts["conv"], r3, window, views=7
        )
        o = state.rule(decoder.linear_attn, q, k, v, gate_a, gate_b, xfull, recurrent, kernels)
        mixed, w = (o, z.flatten(0, 1)), w.flatten(0, 1)
    mlp = parts["mlp"] if then is None else partial(parts["mlp"], then=then)
    out = run((key, "mlp"), mlp, r, *mixed, w)
    return out[0], (None if then is None else out[1])


def layers(model: FlashNext, r, xn, state) -> tuple:
    """Every layer of the target over a device step's rows: r [B*T, hc*H] the embedded rows,
    xn the first read's norm where the embedding made it (`embedded`), state `InPlace` or
    `Windowed` (runner/lone_state.py) -> (the residual, the head's read norm of it)."""
    for idx, decoder in enumerate(model.layers):
        r, xn = layer(decoder, idx, r, xn, state, model.kernels, _next_read(model, idx))
    return r, xn


def embedded(model: FlashNext, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of tokens tok [N] on the hyper-connection streams [N, hc*H], and the first
    layer's read norm of them in the same launch (None before a PLE layer, which adds to the
    streams first)."""
    kernels, first, hc = model.kernels, model.layers[0], model.cfg.hc_count
    if first.ple is None:
        norm = first.attn_hyper_connection.hc_norm
        return kernels.embed_rows(model.embed_tokens.weight, tok, hc, (norm.weight, norm.eps))
    return kernels.embed_rows(model.embed_tokens.weight, tok, hc), None


def _next_read(model: FlashNext, idx: int):
    """The hyper-connection that reads layer idx's output next (the next layer's, or the
    head's mixer), whose norm the layer's last write makes; None before a PLE layer, which
    adds to the streams first."""
    layers_ = model.layers
    if idx + 1 == len(layers_):
        return model.hyper_connection_mixer
    return layers_[idx + 1].attn_hyper_connection if layers_[idx + 1].ple is None else None

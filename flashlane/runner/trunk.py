"""The target's layers in a device step, written once: runner/lone_step.py's plain steps and
runner/draft_step.py's drafted ones both run `layers`, with a state from runner/lone_state.py.

A step feeds B sessions a window of T rows each (a plain step: the pending token, T = 1; a
drafted step: the pending token and K drafts, T = K + 1), every op the shared rounds' on the
same rows, so the bits are theirs. The two differ only in where a mixer's session state goes,
which the step's `state` says:

`InPlace` (T = 1) reads and writes it where it lies; `Windowed` (T = K + 1) keeps it per row
until the step knows how many rows it keeps.
"""

from __future__ import annotations

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.runner.lone_state import attention_step

__all__ = ["embedded", "layers", "mlp_half"]


def layers(model: FlashNext, r, xn, at: torch.Tensor, angles: tuple, state) -> tuple:
    """Every layer of the target over the step's rows: r [B*T, hc*H] the embedded rows, xn
    the first read's norm where the embedding made it (`embedded`), at [B*T] the rows'
    positions, angles (cos, sin, attention_once's tensors) from kernels.step_angles, state
    `InPlace` or `Windowed` -> (the residual, the head's read norm of it or None)."""
    kernels, rotary = model.kernels, model.rotary
    cos, sin, once = angles
    for idx, layer in enumerate(model.layers):
        if layer.ple is not None:
            r = state.ple(idx, layer.ple, r, kernels)
        a, w = layer.attn_hyper_connection.read(r, xn)
        if layer.kind == "linear":
            y = state.gdn(idx, layer.linear_attn, a, kernels)
        else:
            caches, table = state.attention(idx)
            y = attention_step(
                layer.self_attn, a, caches, at, cos, sin, rotary, kernels, table, once
            )
        r, xn = mlp_half(model, idx, r, y, w)
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


def mlp_half(model: FlashNext, idx: int, r, y, w) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer idx's mlp_half, with the next read's norm from its last write where one follows
    (`_next_read`): (the residual, that norm or None)."""
    layer, then = model.layers[idx], _next_read(model, idx)
    if then is None:
        return layer.mlp_half(r, y, w, model.kernels), None
    return layer.mlp_half(r, y, w, model.kernels, then)


def _next_read(model: FlashNext, idx: int):
    """The hyper-connection that reads layer idx's output next (the next layer's, or the
    head's mixer), whose norm the layer's last write makes; None before a PLE layer, which
    adds to the streams first."""
    layers_ = model.layers
    if idx + 1 == len(layers_):
        return model.hyper_connection_mixer
    return layers_[idx + 1].attn_hyper_connection if layers_[idx + 1].ple is None else None

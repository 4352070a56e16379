"""Gated DeltaNet layer (linear attention) with explicit per-stream state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.norms import GatedRMSNorm, Stacked, linear
from flashlane.models.rows import Rows

# A prompt of up to this many tokens (one piece, Piece.whole) runs the recurrent rule: rows
# one after another, the fp32 state as a decode row's. Longer prompts run the chunked rule
# (chunks of 64), whose call cost ~0.9 ms of host time a layer for any prompt (H200,
# round_split at e5f3ec1: 8.4 ms of a 20-token prompt's 12.7 ms round). The rule follows the
# prompt alone: a prompt this short is always one piece and keeps no mark
# (sessions/prompt_cache.py), so every run of it computes alike.
SHORT_PROMPT = 64


class ConvWeight(nn.Module):
    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        h, hv = cfg.hidden_size, cfg.linear_num_v_heads
        self.in_proj_qkv = linear(h, cfg.linear_conv_dim)
        self.in_proj_z = linear(h, cfg.linear_value_dim)
        self.in_proj_b = linear(h, hv)
        self.in_proj_a = linear(h, hv)
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.conv1d = ConvWeight(cfg.linear_conv_dim, cfg.linear_conv_kernel)
        self.norm = GatedRMSNorm(cfg.linear_v_head_dim, cfg.rms_eps, cfg.output_gate)
        self.out_proj = linear(cfg.linear_value_dim, h)
        self.in_proj = Stacked(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        self.ops: Kernels = REFERENCE  # FlashNext.use_kernels points it at the device's

    def forward(self, x: torch.Tensor, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H]; records per piece ("gdn", idx): (conv inputs, states)."""
        qkv, a, b, z = self.project(x)
        return self.finish(self.mix(qkv, a, b, rows, kernels), z)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The row-wise input projections: (qkv, the gates' inputs a and b, output gate z), a
        and b [N, HV] column slices of the product. The gates are computed where they are
        read: in the recurrent rule's programs (gates), or by gdn_gates for the chunked rule."""
        qkv, z, b, a = self.in_proj(x)
        return qkv, a, b, z

    def gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The recurrent rule's `gates` argument for a, b [B, T, HV]: it computes the log
        decay and beta as gdn_gates does, without gdn_gates' launch."""
        return a, b, self.A_log, self.dt_bias

    def gate_values(self, a, b, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """gdn_gates of a, b [B, T, HV] -> (log decay g, beta) [B, T, HV], for the chunked rule."""
        g, beta = kernels.gdn_gates(a.flatten(0, 1), b.flatten(0, 1), self.A_log, self.dt_bias)
        return g.view(a.shape), beta.view(b.shape)

    def mix(self, qkv, a, b, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """Conv and the gated delta rule over each piece's session state -> o [N, HV, Dv]."""
        cfg, n = self.cfg, qkv.shape[0]
        # verify windows of equal width run stacked: one recurrent call for all of them; the
        # prompt pieces one chunked call, their rows back to back
        parts = zip(*(rows.split(x, True, True) for x in (qkv, a, b)), rows.groups(True, True))
        outs = [self._mix(qkv, a_p, b_p, group, rows, kernels) for qkv, a_p, b_p, group in parts]
        return rows.join(outs, True, True).reshape(n, cfg.linear_num_v_heads, cfg.linear_v_head_dim)

    def finish(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The gated output norm and the output projection -> [N, H]."""
        n = o.shape[0]
        return self.out_proj(self.norm(o, z.reshape(o.shape)).reshape(n, -1))

    def _mix(self, qkv, a, b, group, rows: Rows, kernels: Kernels) -> torch.Tensor:
        cfg = self.cfg
        sessions = [p.session for p in group]
        if sessions[0] is not None and not group[0].recurrent:
            return self._prompts(qkv, a, b, group, rows, kernels)
        if sessions[0] is None:
            window = qkv.new_zeros(qkv.shape[0], cfg.linear_conv_kernel - 1, qkv.shape[-1])
            state = None
        else:
            window, state = self.state_of(sessions)
        o, xfull, states = self.rule(qkv, a, b, window, state, group[0].recurrent, kernels)
        if sessions[0] is not None:
            self.record(group, xfull, states)
        return o

    def _prompts(self, qkv, a, b, group, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """Prompt pieces [1, their rows, ...] back to back: a conv per piece (each after its
        own window), then the heads, the gates and one chunked call over all of them; the
        pieces that are their whole prompt of up to SHORT_PROMPT rows run the recurrent rule
        instead (the chunked call's host time was most of a short prompt's round), on
        Triton's kernels all in one call (`_short`)."""
        window, state = self.state_of([p.session for p in group])
        n = len(group)
        outs, finals, xfulls = [None] * n, [None] * n, [None] * n
        starts = [p.offset - group[0].offset for p in group]
        short = [i for i, p in enumerate(group) if p.whole and p.length <= SHORT_PROMPT]
        # together on Triton's kernels (a program a session); the references' batched products
        # may round by batch on a CPU's BLAS, so there one call a piece
        for idx in [short] if kernels.name == "triton" and short else [[i] for i in short]:
            shorts = self._short(qkv, a, b, group, idx, (window, state), rows, kernels)
            for i, (o, final, xfull) in shorts:
                outs[i], finals[i], xfulls[i] = o, final, xfull
        rest = [i for i in range(n) if i not in short]
        if rest:
            ys = []
            for i in rest:
                span = slice(starts[i], starts[i] + group[i].length)
                y, xfull = kernels.causal_conv(qkv[:, span], window[i : i + 1], self.conv_weight)
                ys.append(y)
                xfulls[i] = xfull[0]
            y = torch.cat(ys, dim=1) if len(rest) > 1 else ys[0]
            q, k, v = self.heads(y, kernels, contiguous_v=True)
            spans = [slice(starts[i], starts[i] + group[i].length) for i in rest]
            ga, gb = (x if len(rest) == n else _rows_of(x, spans) for x in (a, b))
            g, beta = self.gate_values(ga, gb, kernels)
            lengths = [group[i].length for i in rest]
            # the states as they lie, or gathered by the forward's index tensor: indexing by
            # a host list copies it from pageable memory, and the host waited for the GPU at
            # every GDN layer (an H100's 2k prefill idled 14.5 of 58.7 ms, mostly after them)
            initial = state
            if len(rest) < n:
                at = rows.longs(f"gdn_rest_{group[0].offset}_{n}", lambda: rest)
                initial = state.index_select(0, at)
            o, final = kernels.chunk_gdn(q, k, v, g, beta, initial, lengths=lengths)
            for j, i in enumerate(rest):
                at = sum(lengths[:j])
                outs[i], finals[i] = o[:, at : at + lengths[j]], final[j]
        key = ("gdn", self.layer_idx)
        for piece, xfull, s in zip(group, xfulls, finals):
            piece.pending[key] = (xfull, s[None])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _short(self, qkv, a, b, group, idx, states, rows: Rows, kernels: Kernels):
        """The recurrent rule for the pieces `idx` (short whole prompts) in one conv, one
        heads and one rule call: their rows side by side [len(idx), width], each padded to
        the widest with its last row. A padded row's a and b are -inf, so its gates are a
        decay of exp(0) = 1 and beta = 0: the state goes through it unchanged (S * 1 + k 0),
        and each piece's rows and final state are those of its call alone (a program per
        session and head, the rows in order). states: the group's (conv windows, recurrent
        states); rows: the forward's, whose index lists every layer shares.
        -> (i, (its rows, final state, conv inputs)) for each piece i of idx."""
        window, state = states
        starts = [p.offset - group[0].offset for p in group]
        if len(idx) == 1:  # as is: no gather
            i = idx[0]
            span = slice(starts[i], starts[i] + group[i].length)
            at, x, ga, gb = slice(i, i + 1), qkv[:, span], a[:, span], b[:, span]
        else:
            width = max(group[i].length for i in idx)
            pad = qkv.shape[1]  # the -inf row appended to a and b

            def spots():  # (row, end of its piece) for each padded spot; the first layer's
                return [(starts[i] + t, starts[i] + group[i].length)
                        for i in idx for t in range(width)]  # fmt: skip

            name = f"gdn_short_{group[0].offset}_{idx[0]}_{len(idx)}"
            real = rows.longs(f"{name}_rows", lambda: [min(r, e - 1) for r, e in spots()])
            gates = rows.longs(f"{name}_gates", lambda: [r if r < e else pad for r, e in spots()])
            x = qkv[0].index_select(0, real).unflatten(0, (len(idx), width))
            ab = torch.cat([a[0], b[0]], dim=-1)
            ab = F.pad(ab, (0, 0, 0, 1), value=float("-inf")).index_select(0, gates)
            hv = a.shape[-1]
            ab = ab.unflatten(0, (len(idx), width))
            # every piece: no copy; else the forward's index tensor (`_prompts` says why)
            at = slice(None) if idx == list(range(len(group))) else rows.longs(name, lambda: idx)
            ga, gb = ab[..., :hv], ab[..., hv:]  # a and b: views, rows 2 hv apart
        y, xfull = kernels.causal_conv(x, window[at], self.conv_weight)
        q, k, v = self.heads(y, kernels)
        o, final = kernels.recurrent_gdn(
            q, k, v, None, None, state[at], keep_states=False, gates=self.gates(ga, gb)
        )
        w, n = self.cfg.linear_conv_kernel - 1, [group[i].length for i in idx]
        return [
            (i, (o[j : j + 1, : n[j]], final[j, 0], xfull[j, : w + n[j]]))
            for j, i in enumerate(idx)
        ]

    def state_of(self, sessions) -> tuple[torch.Tensor, torch.Tensor]:
        """The sessions' conv windows [B, k-1, C] and recurrent states [B, HV, Dk, Dv], read
        only (a session's state changes at commit): one session's are views, no copy."""
        mine = [s.gdn[self.layer_idx] for s in sessions]
        if len(mine) == 1:
            return mine[0].conv.unsqueeze(0), mine[0].recurrent.unsqueeze(0)
        return torch.stack([m.conv for m in mine]), torch.stack([m.recurrent for m in mine])

    def rule(self, qkv, a, b, window, state, recurrent: bool, kernels: Kernels):
        """Conv and the gated delta rule over B sequences of T rows: qkv, a, b [B, T, ...] ->
        (o [B, T, HV, Dv], conv inputs xfull [B, k-1+T, C], states: the state after every row
        [B, T, HV, Dk, Dv] (recurrent) or the final one [B, 1, ...] (chunked))."""
        # the chunked rule reads v contiguous: gdn_qk copies it in its launch
        q, k, v, xfull = self.conv_qkv(qkv, window, kernels, contiguous_v=not recurrent)
        if recurrent:  # the gates in the rule's programs
            o, states = kernels.recurrent_gdn(q, k, v, None, None, state, gates=self.gates(a, b))
        else:
            g, beta = self.gate_values(a, b, kernels)
            o, final = kernels.chunk_gdn(q, k, v, g, beta, state)
            states = final.unsqueeze(1)
        return o, xfull, states

    def conv_qkv(self, qkv, window, kernels: Kernels, contiguous_v: bool = False):
        """The conv over [B, T, C] inputs after their window -> (q scaled, k: L2-normed, value
        heads matched [B, T, HV, Dk]; v [B, T, HV, Dv]; the conv inputs [B, k-1+T, C])."""
        y, xfull = kernels.causal_conv(qkv, window, self.conv_weight)
        return (*self.heads(y, kernels, contiguous_v), xfull)

    @property
    def conv_weight(self) -> torch.Tensor:
        """The conv's [C, k] taps (a view of the checkpoint's [C, 1, k])."""
        return self.conv1d.weight[:, 0, :]

    def heads(self, y: torch.Tensor, kernels: Kernels, contiguous_v: bool = False):
        """The conv's output [B, T, C] -> (q scaled, k: L2-normed, value heads matched
        [B, T, HV, Dk]; v [B, T, HV, Dv], a view of y, or with contiguous_v a copy made in
        gdn_qk's launch where the value and key heads are as wide)."""
        cfg = self.cfg
        b, t, _ = y.shape
        kd, vd = cfg.linear_key_dim, cfg.linear_value_dim
        rep = cfg.linear_num_v_heads // cfg.linear_num_k_heads
        dk = cfg.linear_k_head_dim
        if contiguous_v and cfg.linear_v_head_dim == dk:
            return kernels.gdn_qk(y, cfg.linear_num_k_heads, dk, rep, dk**-0.5, with_v=True)
        v = y[..., 2 * kd : 2 * kd + vd].reshape(b, t, cfg.linear_num_v_heads, -1)
        q, k = kernels.gdn_qk(y, cfg.linear_num_k_heads, dk, rep, dk**-0.5)
        return q, k, v

    def record(self, group, xfull: torch.Tensor, states: torch.Tensor) -> None:
        """What commit() needs per verify window: its conv inputs and the state after each of
        its rows, padding rows cut (the prompt pieces record in _prompts)."""
        key, t = ("gdn", self.layer_idx), xfull.shape[1] - (self.cfg.linear_conv_kernel - 1)
        for i, piece in enumerate(group):
            n = piece.length
            piece.pending[key] = (xfull[i, : xfull.shape[1] - t + n], states[i, :n])


def _rows_of(x: torch.Tensor, spans: list[slice]) -> torch.Tensor:
    """x [1, N, ...]'s rows in `spans`, back to back."""
    return torch.cat([x[:, s] for s in spans], dim=1)

"""PLE: hashed n-gram embeddings gated into every hyper-connection stream.

Each token gets `num_ngram_heads` row ids (heads_per_ngram per n-gram order 2..ngram_size)
into one table; n-gram context never reaches back across an EOS (earlier tokens read as EOS)
and the sequence starts after a virtual [EOS] * (ngram_size - 1).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.kernels.rowwise.reference import ngram_ids
from flashlane.models.config import ModelConfig
from flashlane.models.layers.gated_deltanet import ConvWeight
from flashlane.models.layers.norms import RMSNorm, linear
from flashlane.models.rows import Rows
from flashlane.models.table8 import Int8Table, dequantize_rows

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _splitmix64(x: int) -> int:
    x = (x + GAMMA) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def layer_multipliers(vocab: int, ngram_size: int, ple_index: int, seed: int) -> list[int]:
    """Odd hash multipliers per n-gram slot, small enough that id * m never overflows int64."""
    half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
    base = seed + 10007 * ple_index
    return [
        2 * (_splitmix64((base + GAMMA * (i + 1)) & MASK64) % half) + 1 for i in range(ngram_size)
    ]


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def head_vocab_sizes(cfg: ModelConfig, ple_index: int) -> list[int]:
    """Head h of PLE layer i hashes into the (i * heads + h + 1)-th prime >= base."""
    sizes, p = [], cfg.ngram_vocab_size_base - 1
    for _ in range((ple_index + 1) * cfg.num_ngram_heads):
        p += 1
        while not _is_prime(p):
            p += 1
        sizes.append(p)
    return sizes[ple_index * cfg.num_ngram_heads :]


class NGramEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig, ple_index: int):
        super().__init__()
        self.cfg = cfg
        sizes = head_vocab_sizes(cfg, ple_index)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        rows = math.ceil(sum(sizes) / cfg.ngram_vocab_divisor) * cfg.ngram_vocab_divisor
        mult = layer_multipliers(cfg.vocab_size, cfg.ngram_size, ple_index, cfg.ngram_seed)
        # computed here, so made on the CPU even while the model is built on the meta device
        ids = dict(dtype=torch.long, device="cpu")
        self.register_buffer("layer_multipliers", torch.tensor(mult, **ids))
        self.register_buffer("ngram_heads_vocab_sizes", torch.tensor(sizes, **ids))
        self.register_buffer("ngram_heads_offsets", torch.tensor(offsets, **ids))
        self.ngram_embedding = nn.Embedding(rows, cfg.ple_embed_dim // cfg.num_ngram_heads)
        self.ops: Kernels = REFERENCE  # FlashNext.use_kernels points it at the device's
        # an 8-bit table (table8.py) puts an Int8Table in ngram_embedding's place, on the host;
        # the table in host memory (FlashNext.put_ple_tables_on_host): its rows are read by
        # the device's kernel through mapped memory (CUDA's Triton ngram_embed: pinned host
        # memory has a device address), or gathered on the host and copied in (the references)
        self.on_host = False

    def row_ids(self, history: torch.Tensor) -> torch.Tensor:
        """history: [B, n-1+T] ids -> [B, T, heads] table rows (the ones `embed` reads)."""
        cfg = self.cfg
        return ngram_ids(
            history, self.layer_multipliers, self.ngram_heads_vocab_sizes,
            self.ngram_heads_offsets, cfg.ngram_size, cfg.heads_per_ngram, cfg.ple_eos,
        )  # fmt: skip

    def embed(self, history: torch.Tensor) -> torch.Tensor:
        """history: [B, n-1+T] ids (the n-1 before the rows first) -> [B, T, heads * D]: each
        row's heads' table rows side by side (an 8-bit table's in its compute dtype)."""
        cfg = self.cfg
        table = self.ngram_embedding
        if isinstance(table, Int8Table):
            values, eight = table.q, dict(scale=table.scale, dtype=table.dtype)
        else:
            values, eight = table.weight, {}
        if self.on_host and self.ops.name != "triton":
            return gather_on_host(self.row_ids(history), values, **eight).flatten(-2)
        return self.ops.ngram_embed(
            history, self.layer_multipliers, self.ngram_heads_vocab_sizes,
            self.ngram_heads_offsets, cfg.ngram_size, cfg.heads_per_ngram, cfg.ple_eos,
            values, **eight,
        )  # fmt: skip


def gather_on_host(
    ids: torch.Tensor,
    table: torch.Tensor,
    scale: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Rows `ids` [...] (any device) of a host `table` [R, D], gathered on the host (into
    pinned memory where CUDA is there) and copied to ids' device: [..., D]. The copy waits
    for the ids (one sync a call): a graph-free path, for the reference kernels. An 8-bit
    table (table int8 [R, D], scale [R] fp32): its int8 rows and their scales are gathered
    and copied (half the bytes of bf16 rows), then read back in `dtype` on ids' device."""
    rows = _gathered(ids, table)
    if scale is None:
        return rows
    return dequantize_rows(rows, _gathered(ids, scale.unsqueeze(-1)).squeeze(-1), dtype)


def _gathered(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [...] of a host `table` [R, D] -> [..., D] on ids' device."""
    idx = ids.to("cpu").flatten()
    pinned = ids.is_cuda
    rows = torch.empty((idx.numel(), table.shape[1]), dtype=table.dtype, pin_memory=pinned)
    torch.index_select(table, 0, idx, out=rows)
    return rows.view(*ids.shape, table.shape[1]).to(ids.device, non_blocking=pinned)


class PLELayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ple_index: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        hc_h, e = cfg.hc_count * cfg.hidden_size, cfg.ple_embed_dim
        self.ple_embedding = NGramEmbedding(cfg, ple_index)
        self.key_proj = linear(e, hc_h)
        self.value_proj = linear(e, cfg.hidden_size)
        self.norm_key = RMSNorm(hc_h, cfg.rms_eps, group=cfg.hidden_size)
        self.norm_query = RMSNorm(hc_h, cfg.rms_eps, group=cfg.hidden_size)
        self.norm_conv = RMSNorm(hc_h, cfg.rms_eps, group=cfg.hidden_size)
        self.conv1d = ConvWeight(hc_h, cfg.ple_conv_kernel)

    def forward(self, r: torch.Tensor, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """r: [N, hc*H] -> the PLE's addition to r; records ("ple", idx): (conv inputs, ids).
        On Triton's kernels a round's prompt pieces (PROMPTS_TOGETHER or more) run side by
        side (Rows.stack_in); every other group, and every group on the references, alone."""
        groups = rows.groups(True)
        alone = list(range(len(groups)))
        together = [i for i in alone if _prompt(groups[i])] if rows.batch is None else []
        if kernels.name != "triton" or len(together) < PROMPTS_TOGETHER:
            together = []
        alone = [i for i in alone if i not in together]
        ids = rows.split(rows.token_ids, True)
        histories = {i: self.history(groups[i], ids[i]) for i in alone}
        embs = {i: self.ple_embedding.embed(h) for i, h in histories.items()}
        # the prompt pieces side by side, each padded to the widest with its last row: its
        # ids, embedding rows and causal conv then give its real rows its call's alone
        batch = [groups[i][0] for i in together]
        if batch:
            (ids_in,) = rows.stack_in("ple", batch, [rows.token_ids])
            history = self.history(batch, ids_in)
            embs[-1] = self.ple_embedding.embed(history)
        gated, normed = self._gated(r, _placed(rows, embs, batch), kernels)
        xs = rows.split(normed, True)
        convs = {i: self._conv(xs[i], groups[i], histories[i], kernels) for i in alone}
        if batch:
            (x,) = rows.stack_in("ple", batch, [normed])
            convs[-1] = self._conv(x, batch, history, kernels)
        return gated + _placed(rows, convs, batch)

    def stacked(
        self,
        r3: torch.Tensor,
        history: torch.Tensor,
        window: torch.Tensor,
        kernels,
        shift: bool = False,
        added: bool = False,
        table: torch.Tensor | None = None,
    ):
        """forward for B windows of T rows, from tensors alone (a CUDA graph replays it):
        r3 [B, T, hc*H], history [B, n-1+T] ids, window [B, tail, hc*H] ->
        (the addition [B, T, hc*H], the conv inputs [B, tail+T, hc*H]). shift: the conv
        also moves `window` past the rows in place (a session's own window). added: r3 plus
        the addition in its place (kernels.ple_add: one launch, the same bits). table: window
        is the first session's [1, tail, hc*H], session b's at its PLE table row's column 0
        (the Triton conv reads each where it lies)."""
        b, t = r3.shape[:2]
        emb = self.ple_embedding.embed(history).flatten(0, 1)
        gated, normed = self._gated(r3.flatten(0, 1), emb, kernels)
        where = {} if table is None else dict(table=table, column=0)
        y, xfull = kernels.causal_conv(
            normed.unflatten(0, (b, t)), window, self.conv1d.weight[:, 0, :],
            dilation=self.cfg.ple_conv_dilation, shift=shift, **where,
        )  # fmt: skip
        if added:
            return kernels.ple_add(r3, gated.unflatten(0, (b, t)), y), xfull
        return gated.unflatten(0, (b, t)) + y, xfull

    def _gated(self, r: torch.Tensor, emb: torch.Tensor, kernels: Kernels):
        """The rows' embeddings emb [N, heads * D], gated by each stream's query, and the
        conv's norm of that: ([N, hc*H], [N, hc*H]) (kernels.ple_gate)."""
        emb = emb.to(r.dtype)
        norms = (self.norm_key.weight, self.norm_query.weight, self.norm_conv.weight)
        return kernels.ple_gate(
            self.key_proj(emb), r, self.value_proj(emb), *norms, self.norm_key.eps
        )

    def record(self, pieces, xfull: torch.Tensor, history: torch.Tensor) -> None:
        """What commit() needs per piece: its conv inputs and ids up to its length."""
        pad = history.shape[1] - (self.cfg.ngram_size - 1)
        for i, piece in enumerate(pieces):
            n = piece.length
            piece.pending[("ple", self.layer_idx)] = (
                xfull[i, : xfull.shape[1] - pad + n],
                history[i, : history.shape[1] - pad + n],
            )

    def window_of(self, pieces) -> torch.Tensor:
        """The pieces' sessions' conv tails, stacked: [B, tail, hc*H]."""
        return torch.stack([p.session.ple[self.layer_idx].conv for p in pieces])

    def history(self, group, ids: torch.Tensor) -> torch.Tensor:
        """The pieces' n-gram ids: each session's last ids (EOS without one), then ids."""
        ctx = self.cfg.ngram_size - 1
        if group[0].session is None:
            head = ids.new_full((ids.shape[0], ctx), self.cfg.ple_eos)
        else:
            head = torch.stack([p.session.ple[self.layer_idx].ids for p in group])
        return torch.cat([head, ids], dim=1)

    def _conv(self, x: torch.Tensor, group, history: torch.Tensor, kernels: Kernels):
        cfg = self.cfg
        if group[0].session is None:
            window = x.new_zeros(x.shape[0], cfg.ple_tail, x.shape[-1])
        else:
            window = self.window_of(group)
        y, xfull = kernels.causal_conv(
            x, window, self.conv1d.weight[:, 0, :], dilation=cfg.ple_conv_dilation
        )
        if group[0].session is not None:
            self.record(group, xfull, history)
        return y


# prompt pieces a round takes before its PLE layers run them side by side: fewer pay more
# for the padding's gathers (about 11 launches for all) than their own 5 launches each
PROMPTS_TOGETHER = 3


def _prompt(group: list) -> bool:
    """Whether the group is one session's prompt piece (groups(True) gives each its own)."""
    return len(group) == 1 and group[0].session is not None and not group[0].recurrent


def _placed(rows: Rows, parts: dict, batch: list) -> torch.Tensor:
    """Group i's part [B, T, ...] of rows.groups(True) each at its rows of one flat [N, ...];
    the stacked prompt pieces `batch`'s (key -1) through Rows.stack_out."""
    if not batch:
        return rows.join([parts[i] for i in range(len(parts))], True)
    first = next(iter(parts.values()))
    out = first.new_empty(len(rows.token_ids), *first.shape[2:])
    for i, part in parts.items():
        if i < 0:
            rows.stack_out("ple", batch, part, out)
        else:
            rows.put(out, i, part, True)
    return out

"""Losses the language-model loss cannot give: router balance and the QSA indexer's KL.

Both are computed from layer inputs captured by forward hooks, during forwards with grad.

Router balance (Switch): E * sum_e (share of top-k slots routed to e) * (mean prob of e), per
MoE layer, averaged; without it a tiny MoE can route most tokens to a few experts.

The QSA block indexer only chooses which blocks a query attends to (a top-k, no gradient),
so without its own loss it keeps its random init: selection is arbitrary, and relu scores of
exactly 0 tie often, where transformers' unordered topk and our lower-id rule pick different blocks.
As in DeepSeek-V3.2's lightning indexer, it learns to predict where dense attention goes:

    target_t = dense causal attention of query t, averaged over heads, summed per complete
               block, renormalised over the complete blocks        (no gradient)
    loss     = mean over queries with >= 2 complete blocks of KL(target_t || softmax(score_t))

score_t is the indexer's own block score (sum over heads of relu(q . K_b) / sqrt(Di)). Its
input is detached, so the loss trains only the indexer (index_qk_proj and its two norms).
The hook recomputes the layer's q and k the way QSAttention.forward does, for training
sequences (Rows.training) only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashlane.models.layers.moe import SparseMoe
from flashlane.models.layers.qsa_attention import QSAttention
from flashlane.models.layers.rotary import apply_rope

# Per-head indexer score (q . K / sqrt(Di)) every block should reach.
POSITIVE_MARGIN = 0.5


class AuxLosses:
    """Hooks on every MoE and QSA layer (the MTP head's too) of a model in training."""

    def __init__(self, model: torch.nn.Module):
        self.moe_inputs: list[tuple[SparseMoe, torch.Tensor]] = []
        self.indexer_kls: list[torch.Tensor] = []
        for m in model.modules():
            if isinstance(m, SparseMoe):
                m.register_forward_hook(self._on_moe)
            elif isinstance(m, QSAttention):
                m.register_forward_hook(self._on_attention)

    def _on_moe(self, mod: SparseMoe, args: tuple, out: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            self.moe_inputs.append((mod, args[0]))

    def _on_attention(self, mod: QSAttention, args: tuple, out: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            self.indexer_kls.append(indexer_kl(mod, *args[:3]))

    def take(self) -> dict[str, torch.Tensor]:
        """The balance and indexer losses of the forwards since the last take, then forget them."""
        balance = [balance_term(mod, x) for mod, x in self.moe_inputs]
        out = {
            "balance": torch.stack(balance).mean(),
            "indexer": torch.stack(self.indexer_kls).mean(),
        }
        self.moe_inputs, self.indexer_kls = [], []
        return out


def balance_term(moe: SparseMoe, x: torch.Tensor) -> torch.Tensor:
    """x: the MoE input [N, H] -> the Switch balance term of its router."""
    probs = torch.softmax(F.linear(x.float(), moe.gate.weight.float()), dim=-1)
    top = probs.topk(moe.cfg.num_experts_per_tok, dim=-1).indices
    share = F.one_hot(top, moe.cfg.num_experts).float().mean(dim=(0, 1))
    return moe.cfg.num_experts * (share.detach() * probs.mean(0)).sum()


def dense_probs(attn: QSAttention, x: torch.Tensor, rows, rotary) -> torch.Tensor:
    """Dense causal attention probabilities [B, Hq, T, T] of a QSA layer, as its forward
    computes q and k. x: the layer input [B*T, H] of B training sequences of T rows."""
    cfg, (b, t), d = attn.cfg, rows.batch, attn.cfg.head_dim
    cos, sin = rotary.cos_sin(rows.positions, x.dtype)
    q = attn.q_proj(x).reshape(b * t, cfg.num_attention_heads, 2 * d)[..., :d]
    q = apply_rope(attn.q_norm(q), cos, sin).reshape(b, t, -1, d)
    k = attn.k_norm(attn.k_proj(x).reshape(b * t, cfg.num_kv_heads, d))
    k = apply_rope(k, cos, sin).reshape(b, t, -1, d)
    k = k.repeat_interleave(cfg.num_attention_heads // cfg.num_kv_heads, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * d**-0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def indexer_kl(attn: QSAttention, x: torch.Tensor, rows, rotary) -> torch.Tensor:
    """x: the layer input [B*T, H] of B training sequences of T rows -> scalar KL."""
    cfg, (b, t) = attn.cfg, rows.batch
    blk, di = cfg.indexer_block, cfg.indexer_head_dim
    nb = t // blk
    x = x.detach()
    with torch.no_grad():
        probs = dense_probs(attn, x, rows, rotary).mean(1)  # [B, T, T]
        per_block = probs[..., : nb * blk].reshape(b, t, nb, blk).sum(-1)
    cos, sin = rotary.cos_sin(rows.positions, x.dtype)
    iq, raw = attn.indexer.project(x, cos, sin)
    block_keys = attn.indexer.block_keys(raw.reshape(b, t, di)[:, : nb * blk], 0, rotary)
    iq = iq.reshape(b, t, -1, di).float()
    per_head = torch.einsum("bqhd,bkd->bqhk", iq, block_keys.float()) / di**0.5
    index = per_head.relu().sum(2)
    # Block j is complete for query p when its last position (j+1)*blk - 1 <= p.
    complete = (torch.arange(t, device=x.device) + 1) // blk  # [T]
    valid = torch.arange(nb, device=x.device).view(1, -1) < complete.view(-1, 1)  # [T, NB]
    target = per_block.masked_fill(~valid, 0.0)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-12)
    log_q = index.masked_fill(~valid, float("-inf")).log_softmax(-1).masked_fill(~valid, 0.0)
    kl = (target * (target.clamp_min(1e-12).log() - log_q)).sum(-1)  # [B, T]
    # Keep every head's score above a margin, so relu never floors a block to 0: the softmax
    # is shift-invariant, so this costs the KL nothing, and it removes exact ties at 0.
    floor = (POSITIVE_MARGIN - per_head).relu().mean(2).masked_fill(~valid, 0.0)
    return kl[:, complete >= 2].mean() + floor.sum() / (b * valid.sum())

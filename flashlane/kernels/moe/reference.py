"""Mixture of experts: fp32 router with lower-id ties, SwiGLU experts, shared expert."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from flashlane.kernels.linear.fp8 import Fp8Weight, dense
from flashlane.kernels.rowwise.reference import gated_add


def route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per row. x: [N, H]; router: [E, H].

    Softmax in at least fp32; a stable descending sort breaks ties toward the lower expert id.
    Returns (weights [N, k] in x's dtype, ids [N, k] int64), ids in rank order.
    """
    dt = torch.promote_types(x.dtype, torch.float32)
    probs = torch.softmax(F.linear(x.to(dt), router.to(dt)), dim=-1)
    top, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, ids = top[:, :top_k], ids[:, :top_k]
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(x.dtype), ids


def swiglu(
    x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """down(silu(gate x) * up x). x: [N, H]; gate, up: [I, H]; down: [H, I]."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def moe(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
    normalize: bool,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Routed experts. x: [N, H]; gate, up: [E, I, H]; down: [E, H, I] -> [N, H]; with
    `shared` = (gate logit [N, 1], shared expert's output [N, H]), plus the gated shared
    expert: out + sigmoid(gate logit) * output (rowwise gated_add).

    Each (row, slot) output is computed once and the slots are added in rank order, so a
    row's result does not depend on which other rows share the call. FP8 expert stacks
    (Fp8Weight) are dequantized to x's dtype first.
    """
    weights, ids = route(x, router, top_k, normalize)
    return add_slots(expert_slots(x, ids, gate, up, down), weights, shared)


def expert_slots(
    x: torch.Tensor,
    ids: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    first: int = 0,
) -> torch.Tensor:
    """Each (row, slot)'s expert output, once. x: [N, H]; ids: [N, k] expert ids; the stacks
    hold experts first .. first + E - 1 (gate, up: [E, I, H]; down: [E, H, I]) -> [N, k, H],
    zero where a slot's expert is not among them (expert parallel: another rank's)."""
    gate, up, down = (dense(w, x.dtype) for w in (gate, up, down))
    top_k, held = ids.shape[1], gate.shape[0]
    out_slots = x.new_zeros(x.shape[0], top_k, x.shape[1])
    flat = ids.flatten()
    for e in torch.unique(flat).tolist():
        if not first <= e < first + held:
            continue
        where = (flat == e).nonzero().squeeze(1)
        rows = where // top_k
        y = swiglu(x[rows], gate[e - first], up[e - first], down[e - first])
        out_slots = out_slots.index_put((rows, where % top_k), y)
    return out_slots


def add_slots(
    slots: torch.Tensor,
    weights: torch.Tensor,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The slots [N, k, H] weighted [N, k] and added in rank order (slot 0 first), plus the
    gated shared expert (moe's `shared`) -> [N, H]."""
    out = slots[:, 0] * weights[:, 0:1]
    for k in range(1, slots.shape[1]):
        out = out + slots[:, k] * weights[:, k : k + 1]
    return out if shared is None else gated_add(out, *shared)


def moe_placed(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
    normalize: bool,
    first: int,
    reduce: Callable[[torch.Tensor], torch.Tensor],
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """moe on an expert-parallel rank: the router [E, H] routes over every expert, the stacks
    hold experts first .. first + E_rank - 1; `reduce` sums the ranks' slots [N, k, H] (each
    slot is one rank's, zeros elsewhere, so the sum is that rank's value exactly) and the
    slots are added as moe adds them: the same bits as one rank holding every expert."""
    weights, ids = route(x, router, top_k, normalize)
    return add_slots(reduce(expert_slots(x, ids, gate, up, down, first)), weights, shared)


def moe_shared(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
    normalize: bool,
) -> torch.Tensor:
    """moe with the shared expert stacked last: router [E+1, H] (row E: the shared expert's
    gate), gate, up [E+1, I, H], down [E+1, H, I] (expert E: the shared expert) -> the routed
    experts over E, plus sigmoid(x . router[E]) * swiglu_E(x), the logit in x's dtype."""
    e = router.shape[0] - 1
    gate, up, down = (dense(w, x.dtype) for w in (gate, up, down))
    dt = torch.promote_types(x.dtype, torch.float32)
    logit = F.linear(x.to(dt), router[e:].to(dt)).to(x.dtype)
    shared = swiglu(x, gate[e], up[e], down[e])
    return moe(x, router[:e], gate[:e], up[:e], down[:e], top_k, normalize, (logit, shared))

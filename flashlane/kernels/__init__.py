"""Kernel selection: one set of same-signature ops, chosen once at engine start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashlane.kernels.attention import reference as attention_ref
from flashlane.kernels.conv import reference as conv_ref
from flashlane.kernels.gdn import reference as gdn_ref
from flashlane.kernels.linear import reference as linear_ref
from flashlane.kernels.moe import reference as moe_ref
from flashlane.kernels.norms import reference as norms_ref
from flashlane.kernels.rowwise import reference as rowwise_ref
from flashlane.kernels.rowwise import reference_step as step_ref


@dataclass(frozen=True, slots=True)
class Kernels:
    name: str
    chunk_gdn: Callable
    recurrent_gdn: Callable
    gdn_sessions: Callable
    causal_conv: Callable
    conv_sessions: Callable
    select_mask: Callable
    block_keys: Callable
    pool_block_at: Callable
    attention: Callable
    causal_attention: Callable  # the siblings' gated full attention: no mask tensor
    attend_sessions: Callable
    causal_sessions: Callable  # a sibling's lone step: causal attention over session caches
    moe: Callable
    moe_shared: Callable
    moe_placed: Callable  # an expert-parallel rank's experts (parallel/plan.py)
    linear: Callable
    rms_norm: Callable
    gated_rms_norm: Callable
    # the layers' row-wise tails (kernels/rowwise)
    hc_down: Callable
    hc_up_mix: Callable
    hc_write: Callable
    hc_write_norm: Callable
    gdn_gates: Callable
    gdn_qk: Callable
    rope: Callable
    norm_rope_heads: Callable
    cos_sin: Callable
    ngram_embed: Callable
    ple_gate: Callable
    swiglu: Callable
    gated_heads: Callable
    greedy_step: Callable
    accept_window: Callable  # a drafted step's verdict (runner/draft_step.py)
    draft_pick: Callable  # its MTP drafts' greedy picks
    embed_rows: Callable
    record_row: Callable
    step_angles: Callable
    ple_add: Callable
    push_history: Callable
    gather_sessions: Callable  # session buffers through a table (runner/lone.py's graphs)
    put_sessions: Callable
    put_sessions_from: Callable  # a slice of each batch's rows (drafted steps' commits)


REFERENCE = Kernels(
    name="reference",
    chunk_gdn=gdn_ref.chunk_gdn,
    recurrent_gdn=gdn_ref.recurrent_gdn,
    gdn_sessions=gdn_ref.gdn_sessions,
    causal_conv=conv_ref.causal_conv,
    conv_sessions=conv_ref.conv_sessions,
    select_mask=attention_ref.select_mask,
    block_keys=attention_ref.block_keys,
    pool_block_at=attention_ref.pool_block_at,
    attention=attention_ref.attention,
    causal_attention=attention_ref.causal_attention,
    attend_sessions=attention_ref.attend_sessions,
    causal_sessions=attention_ref.causal_sessions,
    moe=moe_ref.moe,
    moe_shared=moe_ref.moe_shared,
    moe_placed=moe_ref.moe_placed,
    linear=linear_ref.linear,
    rms_norm=norms_ref.rms_norm,
    gated_rms_norm=norms_ref.gated_rms_norm,
    hc_down=rowwise_ref.hc_down,
    hc_up_mix=rowwise_ref.hc_up_mix,
    hc_write=rowwise_ref.hc_write,
    hc_write_norm=rowwise_ref.hc_write_norm,
    gdn_gates=rowwise_ref.gdn_gates,
    gdn_qk=rowwise_ref.gdn_qk,
    rope=rowwise_ref.rope,
    norm_rope_heads=rowwise_ref.norm_rope_heads,
    cos_sin=rowwise_ref.cos_sin,
    ngram_embed=rowwise_ref.ngram_embed,
    ple_gate=rowwise_ref.ple_gate,
    swiglu=rowwise_ref.swiglu,
    gated_heads=rowwise_ref.gated_heads,
    greedy_step=rowwise_ref.greedy_step,
    accept_window=rowwise_ref.accept_window,
    draft_pick=rowwise_ref.draft_pick,
    embed_rows=rowwise_ref.embed_rows,
    record_row=step_ref.record_row,
    step_angles=step_ref.step_angles,
    ple_add=rowwise_ref.ple_add,
    push_history=rowwise_ref.push_history,
    gather_sessions=rowwise_ref.gather_sessions,
    put_sessions=rowwise_ref.put_sessions,
    put_sessions_from=rowwise_ref.put_sessions_from,
)


# decode windows' attention by default (--kernels auto): "listed" (triton_listed.py) or
# "gather" (triton_gather.py). Listed: one QSA layer at 16k / 64k keys 45.8 / 48.1 us at one
# stream against 73.9 / 65.8, 2.5 us slower at 64 tokens (results/attention_decode_h200_8299589)
DECODE = "listed"


def select_kernels(
    device: torch.device | str, log=None, reference: bool = False, decode: str = "auto"
) -> Kernels:
    """The kernels for a device, chosen once at engine start: the pure-torch references on
    the CPU; on CUDA the Triton kernels (row-invariant), or the references where Triton is
    missing (then a row's bits may depend on the batch, and the log says so) or asked for
    (`reference`: EngineConfig.kernels, --kernels reference, FLASHLANE_KERNELS=reference).
    The Triton set's decode windows read only their allowed keys (the gathered attention,
    kernels/attention/triton_gather.py) and long rows' select is spread over programs
    (triton_select_spread.py). `decode` (--kernels): `auto` (DECODE), `gather`, `listed`
    (triton_listed.py), or `walk` (the split walk and one select program a row, for
    comparison); process-wide switches."""
    decode = DECODE if decode == "auto" else decode
    if decode not in ("gather", "listed", "walk"):
        raise ValueError(f"select_kernels: decode {decode!r}: auto, gather, listed or walk")
    if torch.device(device).type != "cuda" or reference:
        return REFERENCE
    try:
        from flashlane.kernels.gpu import TRITON
    except ImportError as err:
        if log is not None:
            log(f"flashlane: Triton kernels unavailable ({err}); using the torch references")
        return REFERENCE
    from flashlane.kernels.attention import triton as attention_tr
    from flashlane.kernels.attention import triton_listed as listed_tr
    from flashlane.kernels.attention import triton_select as select_tr

    attention_tr.GATHER = select_tr.SPREAD = decode != "walk"
    listed_tr.LISTED = decode == "listed"
    return TRITON

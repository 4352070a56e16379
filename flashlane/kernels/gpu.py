"""The CUDA kernel set: Triton kernels whose per-row results do not depend on the batch.

Imported only on CUDA (it needs triton); `select_kernels` falls back to the references when
this import fails. fla-core's chunked GDN serves prompt pieces where it is installed.
"""

from __future__ import annotations

from flashlane.kernels import Kernels
from flashlane.kernels.attention import triton as attention_tr
from flashlane.kernels.attention import triton_blocks as blocks_tr
from flashlane.kernels.attention import triton_causal as causal_tr
from flashlane.kernels.attention import triton_sessions as sessions_tr
from flashlane.kernels.conv import triton as conv_tr
from flashlane.kernels.gdn import fla_chunk
from flashlane.kernels.gdn import triton as gdn_tr
from flashlane.kernels.linear.triton_fp8 import linear
from flashlane.kernels.moe import triton_fp8 as moe_tr
from flashlane.kernels.norms import triton as norms_tr
from flashlane.kernels.rowwise import triton as rowwise_tr
from flashlane.kernels.rowwise import triton_accept as accept_tr
from flashlane.kernels.rowwise import triton_greedy as greedy_tr
from flashlane.kernels.rowwise import triton_hc as hc_tr
from flashlane.kernels.rowwise import triton_hc_up as hc_up_tr
from flashlane.kernels.rowwise import triton_heads as heads_tr
from flashlane.kernels.rowwise import triton_ple as ple_tr
from flashlane.kernels.rowwise import triton_rope as rope_tr
from flashlane.kernels.rowwise import triton_rows as rows_tr
from flashlane.kernels.rowwise import triton_tables as tables_tr

TRITON = Kernels(
    name="triton",
    chunk_gdn=fla_chunk.chunk_gdn,  # varlen: a round's prompt pieces in one call
    recurrent_gdn=gdn_tr.recurrent_gdn,
    gdn_sessions=gdn_tr.gdn_sessions,  # each session's state in place
    causal_conv=conv_tr.causal_conv,  # one launch for y and xfull (the reference makes ~9)
    conv_sessions=conv_tr.conv_sessions,  # each session's window in place
    select_mask=attention_tr.select_mask,
    block_keys=blocks_tr.block_keys,
    pool_block_at=blocks_tr.pool_block_at,
    attention=attention_tr.attention,
    causal_attention=causal_tr.causal_attention,  # positions, no [B, T, L] mask
    attend_sessions=sessions_tr.attend_sessions,  # B sessions in six launches
    causal_sessions=causal_tr.causal_sessions,  # a sibling's B sessions in three launches
    moe=moe_tr.moe,  # bf16 or Fp8Weight expert stacks
    moe_shared=moe_tr.moe_shared,  # the shared expert as one more expert of the launches
    moe_placed=moe_tr.moe_placed,  # expert parallel: not on the GPU yet (it says so)
    linear=linear,  # bf16 weights, and Fp8Weight's e4m3 bytes and block scales
    rms_norm=norms_tr.rms_norm,
    gated_rms_norm=norms_tr.gated_rms_norm,
    hc_down=hc_tr.hc_down,
    hc_up_mix=hc_up_tr.hc_up_mix,  # the up projection with the mix in its tile
    hc_write=hc_tr.hc_write,
    hc_write_norm=hc_tr.hc_write_norm,
    gdn_gates=rowwise_tr.gdn_gates,
    gdn_qk=rowwise_tr.gdn_qk,
    rope=rope_tr.rope,
    norm_rope_heads=heads_tr.norm_rope_heads,  # an attention's q, k, indexer q: one launch
    cos_sin=rope_tr.cos_sin,
    ngram_embed=ple_tr.ngram_embed,  # the n-gram rows and their embeddings
    ple_gate=ple_tr.ple_gate,  # two norms, the streams' sums, the gate and the conv's norm
    swiglu=rowwise_tr.swiglu,
    gated_heads=rowwise_tr.gated_heads,
    accept_window=accept_tr.accept_window,  # a drafted step's kept rows, in one launch
    greedy_step=greedy_tr.greedy_step,  # a lone step's first maximum, flag, token, position
    draft_pick=greedy_tr.draft_pick,  # an MTP draft's first maximum into its column
    embed_rows=rows_tr.embed_rows,  # a lone step's first rows, PDL launches (torch's are not)
    record_row=rows_tr.record_row,  # with the step's verdict stored into the pinned ring
    step_angles=rows_tr.step_angles,  # the rows' and their blocks' cos / sin, and lengths
    ple_add=ple_tr.ple_add,  # a lone step's r + (gated + conv) in one launch
    push_history=ple_tr.push_history,  # its n-gram ids moved on in place, in one launch
    gather_sessions=tables_tr.gather_sessions,  # session buffers through a table
    put_sessions=tables_tr.put_sessions,
    put_sessions_from=tables_tr.put_sessions_from,
)

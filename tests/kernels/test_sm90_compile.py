"""The Triton kernels compile for the H200 (sm_90) on any machine: each is compiled through
ptxas (bundled with triton) at Flash Next's sizes, bf16, without a GPU. A kernel that the
interpreter runs but the GPU compiler rejects (types, shapes, constexpr use) fails here, in
CI, before a device call finds it. Kernels added after a session's device time ran out
belong here first. This file holds the row-wise, recurrent, norm, conv and sampler kernels;
test_sm90_compile_attention.py the attention and the indexer's; test_sm90_compile_gemm.py
the GEMMs (linear, MoE).

    python -m pytest tests/kernels/test_sm90_compile.py     # needs triton; no GPU
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from flashlane.kernels.conv import triton as conv  # noqa: E402
from flashlane.kernels.gdn import triton as gdn  # noqa: E402
from flashlane.kernels.linear import act_quant  # noqa: E402
from flashlane.kernels.norms import triton as norms  # noqa: E402
from flashlane.kernels.rowwise import triton as rowwise  # noqa: E402
from flashlane.kernels.rowwise import triton_accept as rowwise_accept  # noqa: E402
from flashlane.kernels.rowwise import triton_greedy as rowwise_greedy  # noqa: E402
from flashlane.kernels.rowwise import triton_hc as rowwise_hc  # noqa: E402
from flashlane.kernels.rowwise import triton_hc_up as rowwise_hc_up  # noqa: E402
from flashlane.kernels.rowwise import triton_heads as rowwise_heads  # noqa: E402
from flashlane.kernels.rowwise import triton_ple as rowwise_ple  # noqa: E402
from flashlane.kernels.rowwise import triton_rope as rowwise_rope  # noqa: E402
from flashlane.kernels.rowwise import triton_rows as rowwise_rows  # noqa: E402
from flashlane.kernels.rowwise import triton_tables as rowwise_tables  # noqa: E402
from flashlane.kernels.sampling import triton_draw, triton_lone, triton_top_p  # noqa: E402
from tests.kernels.sm90 import BF, compiles_for_sm90  # noqa: E402

# the attention's q, k and indexer q: 24 + 2 heads of 256, 4 of 128, 64 rotated
HEADS = {
    f"{k}{i}": v
    for i in range(3)
    for k, v in dict(x=BF, w=BF, y=BF, sn="i32", sh="i32", eps="fp32").items()
}
HEADS.update(cos_ptr=BF, sin_ptr=BF, stride_c="i32")
HEADS_SIZES = dict(H0=24, H1=2, H2=4, D0=256, D1=256, D2=128, B0=256, B1=256, B2=128, R=64, PDL=1)

KERNELS = {
    "ngram_ids": (rowwise._ngram_kernel,
                  dict(hist_ptr="*i64", mult_ptr="*i64", size_ptr="*i64", off_ptr="*i64",
                       out_ptr="*i64", t="i32", stride="i32", eos="i32"),
                  dict(N=3, HEADS=8, HP2=8)),
    "ngram_embed": (rowwise_ple._ngram_embed_kernel,
                    dict(hist_ptr="*i64", mult_ptr="*i64", size_ptr="*i64", off_ptr="*i64",
                         table_ptr=BF, out_ptr=BF, t="i32", stride="i32", eos="i32"),
                    dict(N=3, HEADS=8, HP2=8, D=160, DP2=256)),
    "embed_rows": (rowwise_rows._embed_rows_kernel,
                   dict(w_ptr=BF, tok_ptr="*i64", out_ptr=BF, h="i32", width="i32"),
                   dict(BLOCK=2048, PDL=1), dict(launch_pdl=True)),
    "record_row": (rowwise_rows._record_row_kernel,
                   dict(src_ptr=BF, rows_ptr=BF, k_ptr="*i64", count_ptr="*i32",
                        out_ptr="*i64", ring_ptr="*i64", width="i32", n_out="i32"),
                   dict(PROGRAMS=5, BLOCK=2048, RING=4, OUT_BLOCK=16, PDL=1),
                   dict(launch_pdl=True)),
    "step_angles": (rowwise_rows._step_angles_kernel,
                    dict(pos_ptr="*i64", inv_ptr="*fp32", cos_ptr=BF, sin_ptr=BF, len_ptr="*i64",
                         win_ptr="*i64", n="i32", first="i32"),
                    dict(R=64, RP2=64, BLOCK=64, PDL=1),
                    dict(launch_pdl=True)),
    "step_angles of windows": (rowwise_rows._step_angles_kernel,
                               dict(pos_ptr="*i64", inv_ptr="*fp32", cos_ptr=BF, sin_ptr=BF,
                                    len_ptr="*i64", win_ptr="*i64", n="i32", first="i32"),
                               dict(R=64, RP2=64, BLOCK=64, T=3, PDL=1), dict(launch_pdl=True)),
    "accept_window": (rowwise_accept._accept_kernel,
                      dict(l_ptr=BF, best_ptr="*fp32", at_ptr="*i32", nan_ptr="*i32",
                           count_ptr="*i32", ids_ptr="*i64", drafts_ptr="*i64",
                           firsts_ptr="*i64", out_ptr="*i64", tok_ptr="*i64", pos_ptr="*i64",
                           marks_ptr="*i64", B="i32", v="i32", stride_l="i32",
                           stride_d="i32", stride_tok="i32"),
                      dict(T=3, BT=4, PARTS=61, PARTS_P2=64, CHUNK=4096, BLOCK=1024, PDL=1),
                      dict(num_warps=4, launch_pdl=True)),
    "gather_sessions with a tail": (rowwise_tables._sessions_kernel,
                                    dict(base_ptr="*i64", tab_ptr="*i64", dense_ptr="*i64",
                                         tail_ptr="*i64", n="i32", nt="i32"),
                                    dict(COLUMN=1, PUT=False, BLOCK=1024, PDL=1),
                                    dict(launch_pdl=True)),
    "put_sessions": (rowwise_tables._sessions_kernel,
                     dict(base_ptr=BF, tab_ptr="*i64", dense_ptr=BF, tail_ptr=BF, n="i32",
                          nt="i32"), dict(COLUMN=0, PUT=True, BLOCK=1024, PDL=1),
                     dict(launch_pdl=True)),
    "put_sessions_from": (rowwise_tables._put_from_kernel,
                          dict(base_ptr="*fp32", tab_ptr="*i64", src_ptr="*fp32",
                               start_ptr="*i64", n="i32", row="i32", stride="i32"),
                          dict(COLUMN=0, BLOCK=1024, PDL=1), dict(launch_pdl=True)),
    "put_sessions_from_two": (rowwise_tables._put_from_two_kernel,
                              dict(base0=BF, src0=BF, start0="*i64", base1="*fp32",
                                   src1="*fp32", start1="*i64", tab_ptr="*i64", n0="i32",
                                   row0="i32", stride0="i32", n1="i32", row1="i32",
                                   stride1="i32"),
                              dict(C0=1, C1=0, BLOCK=1024, PDL=1), dict(launch_pdl=True)),
    "act_quant": (act_quant._act_quant_kernel,
                  dict(x_ptr=BF, q_ptr="*fp8e4nv", s_ptr="*fp32", M="i32", K="i32",
                       KS="i32", stride_x="i32"),
                  dict(ROWS=act_quant.ROWS, BLOCK=128, PDL=1),
                  dict(num_warps=4, launch_pdl=True)),
    "post_ring": (rowwise_rows._post_ring_kernel,
                  dict(out_ptr="*i64", ring_ptr="*i64", k_ptr="*i64", n="i32"),
                  dict(RING=4, BLOCK=16, PDL=1), dict(launch_pdl=True)),
    "embed_norm": (rowwise_rows._embed_norm_kernel,
                   dict(w_ptr=BF, tok_ptr="*i64", nw_ptr=BF, out_ptr=BF, xn_ptr=BF, eps="fp32",
                        stride_tok="i32"),
                   dict(H=2560, COPIES=4, BLOCK=4096, PDL=1),
                   dict(num_warps=16, launch_pdl=True)),
    "ple_add": (rowwise_ple._ple_add_kernel, dict(r_ptr=BF, g_ptr=BF, y_ptr=BF, out_ptr=BF,
                                                  n="i32"),
                dict(BLOCK=1024, PDL=1), dict(launch_pdl=True)),
    "push_history": (rowwise_ple._push_history_kernel,
                     dict(ids_ptr="*i64", tok_ptr="*i64", hist_ptr="*i64"),
                     dict(CTX=2, BLOCK=4, PDL=1), dict(launch_pdl=True)),
    "ple_gate": (rowwise_ple._ple_gate_kernel,
                 dict(k_ptr=BF, r_ptr=BF, v_ptr=BF, wk_ptr=BF, wq_ptr=BF, wc_ptr=BF, g_ptr=BF,
                      n_ptr=BF, eps="fp32", root="fp32", stride_k="i32", stride_r="i32",
                      stride_v="i32"),
                 dict(H=2560, HC=4, BLOCK=4096)),
    "gdn_qk": (rowwise._gdn_qk_kernel,
               dict(y_ptr=BF, q_ptr=BF, k_ptr=BF, v_ptr=BF, stride="i32", scale="fp32"),
               dict(HEADS=16, DIM=128, REP=3, BLOCK=128, WITH_V=True)),
    "rope": (rowwise_rope._rope_kernel,
             dict(x_ptr=BF, cos_ptr=BF, sin_ptr=BF, y_ptr=BF, heads="i32", stride_n="i32",
                  stride_h="i32", stride_c="i32"), dict(D=256, R=64, BLOCK=256)),
    "norm_rope_heads": (rowwise_heads._norm_rope_heads_kernel, HEADS, HEADS_SIZES,
                        dict(num_warps=1, launch_pdl=True)),
    "cos_sin": (rowwise_rope._cos_sin_kernel, dict(pos_ptr="*i64", inv_ptr="*fp32", cos_ptr=BF,
                                               sin_ptr=BF), dict(R=64, BLOCK=4, RP2=64)),
    "hc_squash": (rowwise_hc._squash_kernel, dict(d_ptr=BF, y_ptr=BF, stride="i32", n="i32"),
                  dict(HC=4, BLOCK=1024)),
    "hc_mix": (rowwise_hc._hc_mix_kernel,
               dict(u_ptr=BF, xn_ptr=BF, inj_ptr=BF, a_ptr=BF, w_ptr=BF, h="i32",
                    stride_inj="i32"), dict(HC=4, HC_P2=4, INJECT=True, BLOCK=1024)),
    "hc_up_mix decode": (rowwise_hc_up._hc_up_mix_kernel,
                         dict(x_ptr=BF, w_ptr=BF, xn_ptr=BF, inj_ptr=BF, a_ptr=BF, wo_ptr=BF,
                              M="i32", H="i32", K="i32", stride_x="i32", stride_inj="i32",
                              prefetch="i32"),
                         dict(HC=4, HC_P2=4, INJECT=True, PARTS=1, BLOCKS_PER_PART=3,
                              BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, FP32_PRODUCTS=False,
                              PDL=1),
                         dict(num_warps=4, num_stages=3, launch_pdl=True)),
    "hc_up_mix 2 streams": (rowwise_hc_up._hc_up_mix_kernel,
                            dict(x_ptr=BF, w_ptr=BF, xn_ptr=BF, inj_ptr=BF, a_ptr=BF,
                                 wo_ptr=BF, M="i32", H="i32", K="i32", stride_x="i32",
                                 stride_inj="i32", prefetch="i32"),
                            dict(HC=2, HC_P2=2, INJECT=False, PARTS=1, BLOCKS_PER_PART=1,
                                 BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, FP32_PRODUCTS=False),
                            dict(num_warps=4, num_stages=3)),
    "greedy_step": (rowwise_greedy._greedy_kernel,
                    dict(l_ptr=BF, best_ptr="*fp32", at_ptr="*i32", nan_ptr="*i32",
                         count_ptr="*i32", out_ptr="*i64", tok_ptr="*i64", pos_ptr="*i64",
                         v="i32", stride_l="i32", stride_out="i32"),
                    dict(PARTS=61, PARTS_P2=64, CHUNK=4096, BLOCK=1024, PDL=1),
                    dict(num_warps=4, launch_pdl=True)),
    "draft_pick": (rowwise_greedy._greedy_kernel,
                   dict(l_ptr=BF, best_ptr="*fp32", at_ptr="*i32", nan_ptr="*i32",
                        count_ptr="*i32", out_ptr="*i64", tok_ptr="*i64", pos_ptr="*i64",
                        v="i32", stride_l="i32", stride_out="i32"),
                   dict(PARTS=61, PARTS_P2=64, CHUNK=4096, BLOCK=1024, PICK=1, PDL=1),
                   dict(num_warps=4, launch_pdl=True)),
    "hc_write": (rowwise_hc._hc_write_kernel, dict(r_ptr=BF, y_ptr=BF, w_ptr=BF, out_ptr=BF,
                                                 h="i32"), dict(HC=4, BLOCK=1024)),
    "hc_write_norm": (rowwise_hc._hc_write_norm_kernel,
                      dict(r_ptr=BF, y_ptr=BF, w_ptr=BF, nw_ptr=BF, out_ptr=BF, xn_ptr=BF,
                           idx_ptr=BF, eps="fp32", per="i32"), dict(H=2560, HC=4, BLOCK=4096),
                      dict(num_warps=16)),
    "hc_write_norm of picked rows": (rowwise_hc._hc_write_norm_kernel,
                                     dict(r_ptr=BF, y_ptr=BF, w_ptr=BF, nw_ptr=BF, out_ptr=BF,
                                          xn_ptr=BF, idx_ptr="*i64", eps="fp32", per="i32"),
                                     dict(H=2560, HC=4, BLOCK=4096, PICK=1),
                                     dict(num_warps=16)),
    "gdn_gates": (rowwise._gdn_gates_kernel,
                  dict(a_ptr=BF, b_ptr=BF, alog_ptr="*fp32", dtb_ptr=BF, g_ptr="*fp32",
                       beta_ptr=BF, stride_a="i32", stride_b="i32"), dict(HV=48, BLOCK=64)),
    "gated_heads": (rowwise._gated_heads_kernel, dict(o_ptr=BF, g_ptr=BF, y_ptr=BF,
                                                       heads="i32", stride_n="i32",
                                                       stride_h="i32"), dict(D=256, BLOCK=256)),
    "swiglu": (rowwise._swiglu_kernel, dict(g_ptr=BF, u_ptr=BF, y_ptr=BF, n="i32",
                                             stride_g="i32", stride_u="i32"), dict(BLOCK=1024)),
}  # fmt: skip


# the kernels that have run on the H200 too, at the launch options they use there
DRAW = dict(logits_ptr="*fp32", stride="i32", V="i32", ws_ptr="*i64", n="i32", C="i32")
# the recurrent GDN's arguments; with GATES, g_ptr and beta_ptr hold a and b (unused)
RECURRENT = dict(
    q_ptr=BF,
    k_ptr=BF,
    v_ptr=BF,
    g_ptr="*fp32",
    beta_ptr=BF,
    a_ptr="*fp32",
    b_ptr=BF,
    alog_ptr="*fp32",
    dtb_ptr="*fp32",
    s0_ptr="*fp32",
    o_ptr=BF,
    states_ptr="*fp32",
    tab_ptr="*i64",
    T="i32",
    H="i32",
    stride_v="i32",
    stride_a="i32",
    stride_b="i32",
    keep_states="i32",
    use_table="i32",
)
KERNELS.update({
    "rms_norm": (norms._rms_norm_kernel, dict(x_ptr=BF, w_ptr=BF, y_ptr=BF, idx_ptr=BF,
                                               rows="i32", eps="fp32", stride_x="i32",
                                               keep_ptr=BF, per="i32"),
                 dict(D=10240, G=2560, BLOCK=4096), dict(num_warps=16)),
    "rms_norm gathered": (norms._rms_norm_kernel,
                          dict(x_ptr=BF, w_ptr=BF, y_ptr=BF, idx_ptr="*i64", rows="i32",
                               eps="fp32", stride_x="i32", keep_ptr=BF, per="i32"),
                          dict(D=10240, G=10240, BLOCK=16384, GATHER=1), dict(num_warps=16)),
    "rms_norm keeping rows": (norms._rms_norm_kernel,
                              dict(x_ptr=BF, w_ptr=BF, y_ptr=BF, idx_ptr="*i64", rows="i32",
                                   eps="fp32", stride_x="i32", keep_ptr=BF, per="i32"),
                              dict(D=10240, G=2560, BLOCK=4096, KEEP=1), dict(num_warps=16)),
    "gated_rms_norm": (norms._gated_rms_norm_kernel,
                       dict(x_ptr=BF, gate_ptr=BF, w_ptr=BF, y_ptr=BF, rows="i32", eps="fp32",
                            per="i32", stride_g="i32"),
                       dict(D=128, SIGMOID=True, ROUND_PROD=True, BLOCK=128,
                            ROWS=norms._gated_rows(128)[0]),
                       dict(num_warps=norms._gated_rows(128)[1])),
    # the siblings' GDN norm
    "gated_rms_norm silu": (norms._gated_rms_norm_kernel,
                            dict(x_ptr=BF, gate_ptr=BF, w_ptr=BF, y_ptr=BF, rows="i32",
                                 eps="fp32", per="i32", stride_g="i32"),
                            dict(D=128, SIGMOID=False, ROUND_PROD=True, BLOCK=128,
                                 ROWS=norms._gated_rows(128)[0]),
                            dict(num_warps=norms._gated_rows(128)[1])),
    "recurrent_gdn": (gdn._recurrent_gdn_kernel, RECURRENT,
                      dict(DK=128, DV=128, BK=128, BV=gdn.BV, HAS_STATE=True),
                      dict(num_warps=gdn.NUM_WARPS)),
    "recurrent_gdn gates inside": (gdn._recurrent_gdn_kernel,
                                   dict(RECURRENT, g_ptr=BF, a_ptr=BF, dtb_ptr=BF),
                                   dict(DK=128, DV=128, BK=128, BV=gdn.BV, HAS_STATE=True,
                                        GATES=1, PDL=1),
                                   dict(num_warps=gdn.NUM_WARPS, launch_pdl=True)),
    "causal_conv": (conv._causal_conv_kernel,
                    dict(x_ptr=BF, win_ptr=BF, w_ptr=BF, y_ptr=BF, xfull_ptr=BF, tab_ptr="*i64",
                         use_table="i32", T="i32",
                         C="i32", **dict.fromkeys(["stride_xb", "stride_xt", "stride_xc",
                                                   "stride_winb", "stride_wint", "stride_winc",
                                                   "stride_wc", "stride_wk"], "i32")),
                    dict(K=4, DIL=1, SILU=True, BLOCK_T=1, BLOCK_C=conv.MAX_BLOCK_C,
                         BLOCK_W=4, COLUMN=1), dict(enable_fp_fusion=False)),
    "causal_conv shift": (conv._causal_conv_kernel,
                          dict(x_ptr=BF, win_ptr=BF, w_ptr=BF, y_ptr=BF, xfull_ptr=BF,
                               tab_ptr="*i64", use_table="i32", T="i32",
                               C="i32", **dict.fromkeys(["stride_xb", "stride_xt", "stride_xc",
                                                         "stride_winb", "stride_wint",
                                                         "stride_winc", "stride_wc",
                                                         "stride_wk"], "i32")),
                          dict(K=4, DIL=1, SILU=True, BLOCK_T=1, BLOCK_C=conv.MAX_BLOCK_C,
                               BLOCK_W=4, SHIFT=True, COLUMN=0), dict(enable_fp_fusion=False)),
    "draw stats": (triton_draw._stats_kernel, DRAW, dict(BLOCK=4096, K=16, KP=4),
                   dict(num_warps=triton_draw.WARPS)),
    "draw score": (triton_draw._score_kernel, DRAW,
                   dict(BLOCK=4096, CP=64, KP=4, PLAIN_ROWS=True, TOP_P_ROWS=True),
                   dict(num_warps=triton_draw.WARPS)),
    "draw finish": (triton_draw._finish_kernel, DRAW,
                    dict(CP=64, K=16, KP=4, TOP_P_ROWS=True), dict(num_warps=triton_draw.WARPS)),
    "draw top_p mass": (triton_top_p._mass_kernel, DRAW, dict(BLOCK=4096, CP=64, KP=4),
                        dict(num_warps=triton_draw.WARPS)),
    "lone draw land": (triton_lone._land_kernel,
                       dict(ws_ptr="*i64", n="i32", C="i32", logits_ptr="*fp32", stride="i32",
                            V="i32", out_ptr="*i64", stride_out="i32", tok_ptr="*i64",
                            pos_ptr="*i64"),
                       dict(KP=4, SCAN=4096), {}),
})  # fmt: skip


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_compiles_for_sm90(name):
    """With its pointers aligned, as a launch on torch's tensors specialises it (sm90.py)."""
    compiles_for_sm90(KERNELS[name], aligned=True)

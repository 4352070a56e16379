"""The Triton kernels compile for the H200 (sm_90) on any machine: each is compiled through
ptxas (bundled with triton) at Flash Next's sizes, bf16, without a GPU. A kernel that the
interpreter runs but the GPU compiler rejects (types, shapes, constexpr use) fails here, in
CI, before a device call finds it. Kernels added after a session's device time ran out
belong here first.

    python -m pytest tests/kernels/test_sm90_compile.py     # needs triton; no GPU
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashlane.kernels.attention import triton_blocks, triton_select  # noqa: E402
from flashlane.kernels.rowwise import triton as rowwise  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
BF = "*bf16"
BLOCK_KEY = dict(BLOCK=4, DI=128, R=32, BDI=128)  # the indexer: blocks of 4, 128 dims

KERNELS = {
    "select": (triton_select._select_kernel,
               dict(scores_ptr="*fp32", pos_ptr="*i64", keep_ptr="*i8", mask_ptr="*i8",
                    nb="i32", num_keys="i32"),
               dict(BLOCK=4, TOP=512, CHUNK=1024)),
    "block_keys": (triton_blocks._block_keys_kernel,
                   dict(raw_ptr=BF, cos_ptr=BF, sin_ptr=BF, w_ptr=BF, out_ptr=BF,
                        stride_raw="i32", stride_out="i32", eps="fp32"), BLOCK_KEY),
    "pool_block_at": (triton_blocks._pool_block_at_kernel,
                      dict(keys_ptr=BF, cos_ptr=BF, sin_ptr=BF, w_ptr=BF, out_ptr=BF,
                           pos_ptr="*i64", nb="i32", eps="fp32"), BLOCK_KEY),
    "ngram_ids": (rowwise._ngram_kernel,
                  dict(hist_ptr="*i64", mult_ptr="*i64", size_ptr="*i64", off_ptr="*i64",
                       out_ptr="*i64", t="i32", stride="i32", eos="i32"),
                  dict(N=3, HEADS=8, HP2=8)),
    "gdn_qk": (rowwise._gdn_qk_kernel,
               dict(y_ptr=BF, q_ptr=BF, k_ptr=BF, stride="i32", scale="fp32"),
               dict(HEADS=16, DIM=128, REP=3, BLOCK=128)),
    "rope": (rowwise._rope_kernel,
             dict(x_ptr=BF, cos_ptr=BF, sin_ptr=BF, y_ptr=BF, heads="i32", stride_n="i32",
                  stride_h="i32", stride_c="i32"), dict(D=256, R=64, BLOCK=256)),
    "hc_squash": (rowwise._squash_kernel, dict(d_ptr=BF, y_ptr=BF, stride="i32", n="i32"),
                  dict(HC=4, BLOCK=1024)),
    "hc_mix": (rowwise._hc_mix_kernel,
               dict(u_ptr=BF, xn_ptr=BF, inj_ptr=BF, a_ptr=BF, w_ptr=BF, h="i32",
                    stride_inj="i32"), dict(HC=4, HC_P2=4, INJECT=True, BLOCK=1024)),
    "hc_write": (rowwise._hc_write_kernel, dict(r_ptr=BF, y_ptr=BF, w_ptr=BF, out_ptr=BF,
                                                 h="i32"), dict(HC=4, BLOCK=1024)),
    "gdn_gates": (rowwise._gdn_gates_kernel,
                  dict(a_ptr=BF, b_ptr=BF, alog_ptr="*fp32", dtb_ptr=BF, g_ptr="*fp32",
                       beta_ptr=BF, stride_a="i32", stride_b="i32"), dict(HV=48, BLOCK=64)),
    "swiglu": (rowwise._swiglu_kernel, dict(g_ptr=BF, u_ptr=BF, y_ptr=BF, n="i32",
                                             stride_g="i32", stride_u="i32"), dict(BLOCK=1024)),
    "gated_add": (rowwise._gated_add_kernel, dict(base_ptr=BF, gate_ptr=BF, s_ptr=BF,
                                                   out_ptr=BF, n="i32", stride_gate="i32"),
                  dict(BLOCK=1024)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_compiles_for_sm90(name):
    fn, args, constexprs = KERNELS[name]
    signature = {**args, **dict.fromkeys(constexprs, "constexpr")}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=H200)  # fmt: skip
    assert len(compiled.asm["cubin"]) > 0  # through ptxas: a binary the H200 would load

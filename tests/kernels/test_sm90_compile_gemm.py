"""The GEMMs compile for the H200 (sm_90) on any machine, as test_sm90_compile.py's kernels
do: the row-invariant linear at its decode, prefill, fp32-out, PDL and squash tiles, the
sum of its partitions, and the MoE's grouped GEMMs, combine, route and dispatch.

    python -m pytest tests/kernels/test_sm90_compile_gemm.py     # needs triton; no GPU
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from flashlane.kernels.linear import triton as linear  # noqa: E402
from flashlane.kernels.moe import layout, routing  # noqa: E402
from flashlane.kernels.moe import triton as moe  # noqa: E402
from tests.kernels.sm90 import BF, blocks, compiles_for_sm90, launch  # noqa: E402

# the linear's arguments, and a tile of it
LINEAR = dict(
    x_ptr=BF,
    w_ptr=BF,
    y_ptr=BF,
    ws_ptr="*fp32",
    count_ptr="*i32",
    M="i32",
    N="i32",
    K="i32",
    stride_x="i32",
    stride_y="i32",
    prefetch="i32",
    squash_cols="i32",
)
TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
EXPERTS = dict(
    slot_pair_ptr="*i32",
    block_expert_ptr="*i32",
    H="i32",
    I="i32",
    num_routed="i32",
    shared_id="i32",
)
# the route's layout arguments (read only with LAYOUT: routing.pick_and_lay_out)
ROUTE_LAYOUT = dict(
    count_ptr="*i32",
    slot_pair_ptr="*i32",
    block_expert_ptr="*i32",
    n="i32",
    num_blocks="i32",
    shared_rows="i32",
    routed_blocks="i32",
)
GEMMS = {
    "linear split fixup": (linear._linear_kernel, LINEAR,
                           dict(PARTS=4, BLOCKS_PER_PART=10, SPLIT=True, FIXUP=True, **TILE,
                                FP32_PRODUCTS=False, SQUASH=0), dict(num_warps=4, num_stages=3)),
    "linear in program": (linear._linear_kernel, LINEAR,
                          dict(PARTS=4, BLOCKS_PER_PART=10, SPLIT=False, FIXUP=False, **TILE,
                               FP32_PRODUCTS=False, SQUASH=0), dict(num_warps=4, num_stages=3)),
    "linear decode m16 k128": (linear._linear_kernel, LINEAR,
                               dict(PARTS=40, BLOCKS_PER_PART=2, SPLIT=True, FIXUP=True,
                                    BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                                    FP32_PRODUCTS=False, SQUASH=0),
                               dict(num_warps=4, num_stages=3)),
    "linear prefill 128x128": (linear._linear_kernel, LINEAR,
                               dict(PARTS=10, BLOCKS_PER_PART=4, SPLIT=False, FIXUP=False,
                                    BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                                    FP32_PRODUCTS=False, SQUASH=0),
                               dict(num_warps=8, num_stages=3)),
    "linear prefill flat 128x64": (linear._linear_kernel, LINEAR,
                                   dict(PARTS=40, BLOCKS_PER_PART=4, SPLIT=False, FIXUP=False,
                                        BLOCK_M=128, BLOCK_N=64, BLOCK_K=64,
                                        FP32_PRODUCTS=False, SQUASH=0, FLAT=True),
                                   dict(num_warps=8, num_stages=3)),
    "linear prefill branch 128x128": (linear._linear_kernel, LINEAR,
                                      dict(PARTS=6, BLOCKS_PER_PART=16, SPLIT=False,
                                           FIXUP=False, BLOCK_M=128, BLOCK_N=128,
                                           BLOCK_K=64, FP32_PRODUCTS=False, SQUASH=0, FLAT=2),
                                      dict(num_warps=8, num_stages=4)),
    "linear fp32 out on tensor cores": (linear._linear_kernel,
                                        dict(LINEAR, y_ptr="*fp32"),
                                        dict(PARTS=10, BLOCKS_PER_PART=2, SPLIT=True,
                                             FIXUP=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                                             FP32_PRODUCTS=False, SQUASH=0),
                                        dict(num_warps=4, num_stages=3)),
    "linear PDL": (linear._linear_kernel, LINEAR,
                   dict(PARTS=40, BLOCKS_PER_PART=2, SPLIT=True, FIXUP=True,
                        BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                        FP32_PRODUCTS=False, SQUASH=0, PDL=1),
                   dict(num_warps=4, num_stages=3, launch_pdl=True)),
    "linear PDL in program": (linear._linear_kernel, LINEAR,
                              dict(PARTS=1, BLOCKS_PER_PART=20, SPLIT=False, FIXUP=False,
                                   BLOCK_M=64, BLOCK_N=64, BLOCK_K=128,
                                   FP32_PRODUCTS=False, SQUASH=0, PDL=1),
                              dict(num_warps=4, num_stages=3, launch_pdl=True)),
    "linear squash out (hc down)": (linear._linear_kernel, LINEAR,
                                    dict(PARTS=40, BLOCKS_PER_PART=2, SPLIT=True, FIXUP=True,
                                         BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                                         FP32_PRODUCTS=False, SQUASH=4),
                                    dict(num_warps=4, num_stages=3)),
    "linear router fp32": (linear._linear_kernel, {**LINEAR, "y_ptr": "*fp32"},
                           dict(PARTS=16, BLOCKS_PER_PART=5, SPLIT=True, FIXUP=True,
                                BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, FP32_PRODUCTS=True,
                                SQUASH=0),
                           dict(num_warps=4, num_stages=2)),
    "sum_parts": (linear._sum_parts_kernel, dict(ws_ptr="*fp32", y_ptr=BF, numel="i32",
                                                 n="i32", stride_y="i32",
                                                 squash_cols="i32"),
                  dict(PARTS=4, SQUASH=4, BLOCK=1024), {}),
    "moe gate_up": (moe._gate_up_kernel,
                    dict(x_ptr=BF, gate_ptr=BF, up_ptr=BF, act_ptr=BF, **EXPERTS),
                    dict(TOP_K=10, BLOCK_M=16, **blocks(moe.GATE_UP_TILE), PRECISION="tf32"),
                    launch(moe.GATE_UP_TILE)),
    "moe gate_up one row": (moe._gate_up_kernel,
                            dict(x_ptr=BF, gate_ptr=BF, up_ptr=BF, act_ptr=BF,
                                 **dict(EXPERTS, slot_pair_ptr="*i64", block_expert_ptr="*i64")),
                            dict(TOP_K=10, BLOCK_M=16, **blocks(moe.GATE_UP_TILE),
                                 PRECISION="tf32", ONE_ROW=True),
                            launch(moe.GATE_UP_TILE)),
    "moe down": (moe._down_kernel, dict(act_ptr=BF, down_ptr=BF, y_ptr=BF, **EXPERTS),
                 dict(BLOCK_M=16, **blocks(moe.DOWN_TILE), PRECISION="tf32"),
                 launch(moe.DOWN_TILE)),
    "moe gate_up prefill": (moe._gate_up_kernel,
                            dict(x_ptr=BF, gate_ptr=BF, up_ptr=BF, act_ptr=BF, **EXPERTS),
                            dict(TOP_K=10, BLOCK_M=64, **blocks(moe.GATE_UP_PREFILL),
                                 PRECISION="tf32"),
                            launch(moe.GATE_UP_PREFILL)),
    "moe down prefill": (moe._down_kernel, dict(act_ptr=BF, down_ptr=BF, y_ptr=BF, **EXPERTS),
                         dict(BLOCK_M=64, **blocks(moe.DOWN_PREFILL), PRECISION="tf32"),
                         launch(moe.DOWN_PREFILL)),
    "moe combine + shared": (moe._combine_kernel,
                             dict(y_ptr=BF, w_ptr=BF, out_ptr=BF, gate_ptr=BF, s_ptr=BF,
                                  H="i32", stride_gate="i32"),
                             dict(TOP_K=10, SHARED=True, BLOCK=1024), {}),
    "moe route": (routing._route_kernel, dict(l_ptr="*fp32", w_ptr=BF, ids_ptr="*i64",
                                               stride_l="i32", **ROUTE_LAYOUT),
                  dict(E=512, TOP_K=10, NORMALIZE=True, BLOCK_E=512, BLOCK_K=16), {}),
    "moe route with the layout": (routing._route_kernel,
                                  dict(l_ptr="*fp32", w_ptr=BF, ids_ptr="*i64", stride_l="i32",
                                       **ROUTE_LAYOUT),
                                  dict(E=512, TOP_K=10, NORMALIZE=True, BLOCK_E=512, BLOCK_K=16,
                                       LAYOUT=True, BLOCK_M=16, BLOCK_S=256,
                                       BLOCK_C=routing.CLEAR_CHUNK),
                                  dict(num_warps=routing.ROUTE_WARPS)),
    "moe dispatch": (routing._dispatch_kernel,
                     dict(ids_ptr="*i64", slot_pair_ptr="*i32", block_expert_ptr="*i32",
                          num_pairs="i32", num_blocks="i32", shared_rows="i32",
                          routed_blocks="i32"),
                     dict(E=512, BLOCK_M=16, BLOCK_S=256, BLOCK_C=routing.CLEAR_CHUNK), {}),
    "moe layout count": (layout._count_kernel,
                         dict(ids_ptr="*i64", counts_ptr="*i32", slot_pair_ptr="*i32",
                              num_pairs="i32", num_slots="i32", stripe="i32", chunk="i32"),
                         dict(BLOCK_E=512, BLOCK_P=layout.LAYOUT_CHUNK, BLOCK_C=layout.CLEAR,
                              PDL=1), dict(launch_pdl=True)),
    "moe layout place": (layout._place_kernel,
                         dict(ids_ptr="*i64", counts_ptr="*i32", slot_pair_ptr="*i32",
                              block_expert_ptr="*i32", num_pairs="i32", chunks="i32",
                              chunk="i32", routed_blocks="i32", shared_rows="i32"),
                         dict(E=512, BLOCK_M=64, BLOCK_E=512, BLOCK_P=layout.STEP,
                              BLOCK_B=layout.LABELS, BLOCK_S=layout.SUM_CHUNKS,
                              BLOCK_C=layout.CLEAR, PDL=1), dict(launch_pdl=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GEMMS))
def test_compiles_for_sm90(name):
    """With its pointers aligned, as a launch on torch's tensors specialises it (sm90.py)."""
    compiles_for_sm90(GEMMS[name], aligned=True)

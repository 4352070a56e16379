"""The block-FP8 kernels compile for the H200 (sm_90) on any machine, as
test_sm90_compile.py's: through ptxas at Flash Next's tiles, bf16 activations and e4m3
weights, without a GPU; and the products use the tensor cores (the e4m3 values converted to
bf16 in registers, by bits, not fp32 FMAs).

    python -m pytest tests/kernels/test_sm90_compile_fp8.py     # needs triton; no GPU
"""

from __future__ import annotations

import os
import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)


from flashlane.kernels.linear import triton_fp8 as linear  # noqa: E402
from flashlane.kernels.moe import triton_fp8 as moe  # noqa: E402
from tests.kernels.sm90 import H200_SHARED, blocks, compiles_for_sm90, launch, sass  # noqa: E402

BF, F8 = "*bf16", "*fp8e4nv"
LINEAR = dict(x_ptr=BF, xs_ptr="*fp32", q_ptr=F8, s_ptr="*fp32", y_ptr=BF, ws_ptr="*fp32",
              count_ptr="*i32",
              M="i32", N="i32", K="i32", KS="i32", stride_x="i32", stride_y="i32",
              prefetch="i32")  # fmt: skip
EXPERTS = dict(slot_pair_ptr="*i64", block_expert_ptr="*i64", H="i32", I="i32", HS="i32",
               IS="i32", num_routed="i32", shared_id="i32")  # fmt: skip
GATE_UP = dict(x_ptr=BF, xs_ptr="*fp32", gate_ptr=F8, gate_s_ptr="*fp32", up_ptr=F8,
               up_s_ptr="*fp32", act_ptr=BF, acts_ptr="*fp32", **EXPERTS)  # fmt: skip
# bf16 activations on a GPU: e4m3 converted by bits (triton_fp8.by_bits)
BF16 = dict(BLOCK_K=128, IEEE=False, BY_BITS=True)
# prompt rows: e4m3 activations (kernels/linear/act_quant.py), e4m3 x e4m3 products
E4M3 = dict(BLOCK_K=128, IEEE=False, BY_BITS=False, X_FP8=True)
DOWN = dict(act_ptr=BF, acts_ptr="*fp32", down_ptr=F8, down_s_ptr="*fp32", y_ptr=BF, **EXPERTS)


def _linear(m: int, split: bool, prompt: bool = False, n: int = 2560, k: int = 6144) -> tuple:
    t = linear.fp8_tile(m, n, k, prompt)
    x_fp8 = t.get("X_FP8", False)  # prompt rows: e4m3 activations (act_quant)
    consts = dict(PARTS=t["PARTS"], BLOCKS_PER_PART=t["BLOCKS_PER_PART"],
                  SCALES=triton.next_power_of_2(t["BLOCKS_PER_PART"]), SPLIT=split,
                  FIXUP=split, BLOCK_M=t["BLOCK_M"], BLOCK_N=t["BLOCK_N"],
                  BLOCK_K=t["BLOCK_K"], IEEE=False, BY_BITS=not x_fp8, X_FP8=x_fp8)  # fmt: skip
    args = dict(LINEAR, x_ptr=F8) if x_fp8 else LINEAR
    return linear._fp8_linear_kernel, args, consts, launch(t)


KERNELS = {
    "fp8 linear decode split": _linear(1, True),
    "fp8 linear decode in program": _linear(16, False),
    # a wide weight's decode rows (fp8_tiles.decode_parts): 16 x 128, two partitions
    "fp8 linear decode wide": _linear(1, False, n=16384, k=2560),
    "fp8 linear decode wide split": _linear(1, True, n=12288, k=2560),
    "fp8 linear prefill": _linear(4096, False),
    "fp8 linear prompt": _linear(4096, False, prompt=True),
    "fp8 linear prompt split": _linear(1, True, prompt=True),
    # a wide in-projection: one K partition, prompt rows' 128 x 128 tile (PROMPT_TILE_WHOLE)
    "fp8 linear prompt whole": _linear(4096, False, prompt=True, n=16384, k=2048),
    "fp8 moe gate_up": (moe._gate_up_fp8_kernel, GATE_UP,
                        dict(TOP_K=10, BLOCK_M=16, SCALES=32, **BF16,
                             **blocks(moe.GATE_UP_TILE)), launch(moe.GATE_UP_TILE)),
    "fp8 moe gate_up one row": (moe._gate_up_fp8_kernel, GATE_UP,
                                dict(TOP_K=10, BLOCK_M=16, SCALES=32, **BF16,
                                     ONE_ROW=True, **blocks(moe.GATE_UP_TILE)),
                                launch(moe.GATE_UP_TILE)),
    "fp8 moe down": (moe._down_fp8_kernel, DOWN,
                     dict(BLOCK_M=16, SCALES=8, **BF16,
                          **blocks(moe.DOWN_TILE)),
                     launch(moe.DOWN_TILE)),
    "fp8 moe gate_up prefill": (moe._gate_up_fp8_kernel, GATE_UP,
                                dict(TOP_K=10, BLOCK_M=64, SCALES=32, **BF16,
                                     **blocks(moe.GATE_UP_PREFILL)),
                                launch(moe.GATE_UP_PREFILL)),
    "fp8 moe down prefill": (moe._down_fp8_kernel, DOWN,
                             dict(BLOCK_M=64, SCALES=8, **BF16,
                                  **blocks(moe.DOWN_PREFILL)), launch(moe.DOWN_PREFILL)),
    "fp8 moe gate_up prompt": (moe._gate_up_fp8_kernel, dict(GATE_UP, x_ptr=F8),
                               dict(TOP_K=10, BLOCK_M=moe.PROMPT_BLOCK_M, SCALES=32, **E4M3,
                                    **blocks(moe.GATE_UP_PROMPT)), launch(moe.GATE_UP_PROMPT)),
    # the act quantized in the tile's store (moe.QUANT_IN_TILE)
    "fp8 moe gate_up prompt quantized": (moe._gate_up_fp8_kernel,
                                         dict(GATE_UP, x_ptr=F8, act_ptr=F8),
                                         dict(TOP_K=10, BLOCK_M=moe.PROMPT_BLOCK_M, SCALES=32,
                                              **E4M3, QUANT=triton.language.bfloat16,
                                              **blocks(moe.GATE_UP_PROMPT)),
                                         launch(moe.GATE_UP_PROMPT)),
    "fp8 moe down prompt": (moe._down_fp8_kernel, dict(DOWN, act_ptr=F8),
                            dict(BLOCK_M=moe.PROMPT_BLOCK_M, SCALES=8, **E4M3,
                                 **blocks(moe.DOWN_PROMPT)), launch(moe.DOWN_PROMPT)),
}  # fmt: skip
# the tiles of prompt rows (kernels/row_kind.py): on wgmma
PROMPT = sorted(n for n in KERNELS if "prompt" in n)


@pytest.mark.parametrize("name", PROMPT)
def test_fp8_prompt_tiles_run_on_wgmma_and_keep_their_registers(name):
    """Prompt rows' tiles, as launched: wgmma (HGMMA; QGMMA for the linear's e4m3 x e4m3),
    not mma.sync, and no local-memory
    traffic (the linear's 64 x 128 tile on 4 warps spilled 149 stores:
    benchmarks/fp8_prefill_tiles.py)."""
    import re

    code = sass(compiles_for_sm90(KERNELS[name], aligned=True))
    ops = re.findall(r"\b(HGMMA|QGMMA|HMMA|STL|LDL)\b", code)  # QGMMA: wgmma of e4m3
    assert {"HGMMA", "QGMMA"} & set(ops) and "HMMA" not in ops, "prompt rows not on wgmma"
    assert "STL" not in ops and "LDL" not in ops, f"{ops.count('STL')} local stores"


@pytest.mark.parametrize("name", sorted(n for n in KERNELS if "linear decode" in n))
def test_fp8_decode_tiles_keep_their_registers(name):
    """The linear's decode tiles, the wide weights' 16 x 128 on 4 warps and 5 stages
    (fp8_tiles.DECODE_TILE_WIDE) among them: no local-memory traffic."""
    import re

    ops = re.findall(r"\b(STL|LDL)\b", sass(compiles_for_sm90(KERNELS[name], aligned=True)))
    assert not ops, f"{ops.count('STL')} local stores, {ops.count('LDL')} local loads"


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("aligned", [False, True], ids=["any pointers", "aligned pointers"])
def test_fp8_kernel_compiles_for_sm90_on_the_tensor_cores(name, aligned):
    compiled = compiles_for_sm90(KERNELS[name], aligned)
    assert len(compiled.asm["cubin"]) > 0
    assert compiled.metadata.shared <= H200_SHARED
    ptx = compiled.asm["ptx"]
    assert "mma.sync" in ptx or "wgmma" in ptx, "the products are not on the tensor cores"
    if KERNELS[name][2].get("X_FP8"):  # e4m3 codes on both sides: no conversion at all
        assert re.search(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx), "not e4m3 products"
        return
    # e4m3 to bf16 by bits (triton_fp8.bf16_of_e4m3), not Triton's conversion through f16
    # (one F2F a value: the conversion unit bounded the kernels)
    assert "mul.rn.bf16x2" in ptx, "no conversion by bits"
    assert "cvt.bf16.f16" not in ptx and "e4m3x2" not in ptx, "Triton's e4m3 conversion"


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("aligned", [False, True], ids=["any pointers", "aligned pointers"])
def test_fp8_kernel_waits_under_pdl_before_it_touches_memory(name, aligned):
    """Launched early under PDL (kernels/pdl.py), a kernel's griddepcontrol.wait comes before
    its first global load, store, async copy or atomic (the linear's L2 prefetch of its
    weights aside); with PDL 0 it has none."""
    import re

    fn, args, constexprs, options = KERNELS[name]

    def ptx(flag: int) -> str:
        entry = (fn, args, {**constexprs, "PDL": flag}, dict(options, launch_pdl=bool(flag)))
        return compiles_for_sm90(entry, aligned).asm["ptx"]

    code = ptx(1)
    wait = code.index("griddepcontrol.wait")
    first = re.search(r"\b(ld\.global|st\.global|cp\.async(?!\.bulk\.prefetch)|atom\.|red\.)", code)
    assert first is None or wait < first.start()
    assert "griddepcontrol" not in ptx(0)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("aligned", [False, True], ids=["any pointers", "aligned pointers"])
def test_fp8_kernel_loads_its_scales_before_the_k_loop(name, aligned):
    """A tile's scales are one vector loaded before its K loop (triton_fp8.block_scales): a
    scale loaded in the loop put a load's latency into every K block (half the H200's
    bandwidth at one row). In the loop, only the pipelined copies of x and the weight."""
    ttgir = compiles_for_sm90(KERNELS[name], aligned).asm["ttgir"]
    # the innermost loops: text from an scf.for to its scf.yield with no scf.for between (an
    # outer loop over partitions loads each partition's scales before its K loop)
    loops = [c.split("scf.yield")[0] for c in ttgir.split("scf.for")[1:] if "scf.yield" in c]
    assert loops, "no K loop"
    for body in loops:
        f32_loads = [ln for ln in body.splitlines() if "tt.load" in ln and "f32>" in ln]
        assert not f32_loads, f"a float32 load in the K loop: {f32_loads[0][:120]}"

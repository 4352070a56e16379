"""What the H200's compiler makes of the kernels (sm_90, on any machine, as
test_sm90_compile.py compiles them): the arithmetic and the order of instructions that the
bits and PDL rest on. The router's fp32 tiles are one FMA chain in k's order; every PDL
kernel waits before it touches memory; norm_rope_heads sums squares in rms_norm's layout.

    python -m pytest tests/kernels/test_sm90_codegen.py     # needs triton; no GPU
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from triton.compiler import ASTSource  # noqa: E402

from flashlane.kernels.linear import triton as linear  # noqa: E402
from flashlane.kernels.norms import triton as norms  # noqa: E402
from flashlane.kernels.rowwise import triton_heads as rowwise_heads  # noqa: E402
from tests.kernels.sm90 import BF, H200, compiles_for_sm90, in_loops, sass  # noqa: E402
from tests.kernels.test_sm90_compile import HEADS, HEADS_SIZES  # noqa: E402
from tests.kernels.test_sm90_compile import KERNELS as NON_GEMMS  # noqa: E402
from tests.kernels.test_sm90_compile_attention import ATTENTION_KERNELS  # noqa: E402
from tests.kernels.test_sm90_compile_gemm import GEMMS, LINEAR  # noqa: E402

# every kernel of both compile tables
KERNELS = {**NON_GEMMS, **ATTENTION_KERNELS, **GEMMS}


@pytest.mark.parametrize("tile", ["tile_config", "prefill_tile"])
def test_fp32_products_are_one_fma_chain_in_k_order(tile):
    """The router's fp32 tiles (rows of 16 at decode, 64 above) compile to the same arithmetic
    per output: each K block is one chain of BLOCK_K fused multiply-adds in k's order that
    starts from the loop's accumulator, and PTX holds fma.rn.f32 for every product and no
    separate multiply. So a row's bits do not depend on which tile ran it."""
    import re

    import torch

    t = getattr(linear, tile)(512, 2560, torch.float32)
    constexprs = dict(
        PARTS=t["PARTS"],
        BLOCKS_PER_PART=t["BLOCKS_PER_PART"],
        SPLIT=True,
        FIXUP=True,
        BLOCK_M=t["BLOCK_M"],
        BLOCK_N=t["BLOCK_N"],
        BLOCK_K=t["BLOCK_K"],
        FP32_PRODUCTS=True,
        SQUASH=0,
    )
    signature = {**LINEAR, "y_ptr": "*fp32", **dict.fromkeys(constexprs, "constexpr")}
    compiled = triton.compile(
        ASTSource(fn=linear._linear_kernel, signature=signature, constexprs=constexprs),
        target=H200,
        options=dict(num_warps=t["num_warps"], num_stages=t["num_stages"]),
    )
    llir, ptx = compiled.asm["llir"], compiled.asm["ptx"]
    calls = re.findall(
        r"(%\S+) = tail call <(\d+) x float> @llvm\.fmuladd\.v\d+f32\("
        r"<\d+ x float> %\S+, <\d+ x float> %\S+, <\d+ x float> (%\S+)\)",
        llir,
    )
    assert len(calls) == t["BLOCK_K"]
    made = {c[0] for c in calls}
    heads = [c for c in calls if c[2] not in made]
    assert len(heads) == 1  # one chain: each call adds to the previous one's result
    assert re.search(re.escape(heads[0][2]) + r" = phi ", llir)  # from the loop's acc
    per_thread = t["BLOCK_M"] * t["BLOCK_N"] // (32 * t["num_warps"])
    assert int(calls[0][1]) == per_thread
    assert ptx.count("fma.rn.f32") == per_thread * t["BLOCK_K"]
    assert "mul.f32" not in ptx and "mul.rn.f32" not in ptx


def test_pdl_linear_waits_before_any_memory_access():
    """Under PDL (kernels/pdl.py) the linear's griddepcontrol.wait comes before its first
    global load, store, async copy or atomic, so an early launch reads and writes nothing
    before the kernel before it has finished; the only memory instructions before it are
    its weights' L2 prefetches. Without PDL, no such instruction."""
    import re

    def ptx(pdl: int, split: bool) -> str:
        c = dict(
            PARTS=40 if split else 1,
            BLOCKS_PER_PART=2 if split else 20,
            SPLIT=split,
            FIXUP=split,
            BLOCK_M=16 if split else 64,
            BLOCK_N=64,
            BLOCK_K=128,
            FP32_PRODUCTS=False,
            SQUASH=0,
            PDL=pdl,
        )
        signature = {**LINEAR, **dict.fromkeys(c, "constexpr")}
        options = dict(num_warps=4, num_stages=3, launch_pdl=bool(pdl))
        return triton.compile(
            ASTSource(fn=linear._linear_kernel, signature=signature, constexprs=c),
            target=H200,
            options=options,
        ).asm["ptx"]

    for split in (True, False):
        code = ptx(1, split)
        wait = code.index("griddepcontrol.wait")
        first = re.search(
            r"\b(ld\.global|st\.global|cp\.async(?!\.bulk\.prefetch)|atom\.|red\.)", code
        )
        assert first is not None and wait < first.start()
        assert 0 <= code.index("cp.async.bulk.prefetch.L2.global") < wait
        assert code.index("griddepcontrol.launch_dependents") > wait
        assert "griddepcontrol" not in ptx(0, split)
        assert "prefetch" not in ptx(0, split)


PDL_KERNELS = sorted(name for name, (fn, *_) in KERNELS.items() if "PDL" in fn.arg_names)


def test_the_step_kernels_take_pdl():
    """Every kernel of a decode step has the PDL parameter (kernels/pdl.py): one without it,
    between two that have it, would end the overlap there."""
    assert len(PDL_KERNELS) >= 30
    assert not {
        "linear split fixup",
        "hc_mix",
        "rms_norm",
        "recurrent_gdn",
        "moe gate_up",
        "attention",
        "causal_conv",
        "moe route",
    } - set(PDL_KERNELS)


@pytest.mark.parametrize("name", PDL_KERNELS)
@pytest.mark.parametrize("aligned", [False, True], ids=["any pointers", "aligned pointers"])
def test_pdl_kernel_waits_before_it_touches_memory(name, aligned):
    """Launched early under PDL, a kernel's griddepcontrol.wait comes before its first global
    load, store, async copy or atomic (L2 prefetches of weights aside), and it lets the next
    launch go only after the wait; with PDL 0 it has neither instruction."""
    import re

    fn, args, constexprs, *options = KERNELS[name]

    def ptx(pdl: int) -> str:
        opts = dict(options[0] if options else {}, launch_pdl=bool(pdl))
        return compiles_for_sm90((fn, args, {**constexprs, "PDL": pdl}, opts), aligned).asm["ptx"]

    code = ptx(1)
    wait = code.index("griddepcontrol.wait")
    first = re.search(r"\b(ld\.global|st\.global|cp\.async(?!\.bulk\.prefetch)|atom\.|red\.)", code)
    assert first is None or wait < first.start()
    assert code.index("griddepcontrol.launch_dependents") > wait
    assert "griddepcontrol" not in ptx(0)


def test_norm_rope_heads_sums_squares_as_rms_norm():
    """norm_rope_heads reduces each head's sum of squares in the layout rms_norm does at that
    width (values a thread, threads, warps; pointers 16-byte aligned as at a launch), so the
    sums, and the bits after them, are rms_norm's."""
    import re

    def reduced(fn, args, constexprs, warps):
        signature = {**args, **dict.fromkeys(constexprs, "constexpr")}
        names = list(signature)
        attrs = {
            (names.index(k),): [["tt.divisibility", 16]]
            for k, v in args.items()
            if v.startswith("*")
        }
        ttgir = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
            target=H200,
            options=dict(num_warps=warps),
        ).asm["ttgir"]
        layouts = dict(re.findall(r"^(#\w+) = (#ttg\.blocked<.*>)$", ttgir, re.M))
        return [
            (int(w), layouts[name])
            for w, name in re.findall(r"\(tensor<(\d+)xf32, (#\w+)>\) -> f32", ttgir)
        ]

    fused = reduced(rowwise_heads._norm_rope_heads_kernel, HEADS, HEADS_SIZES, 1)
    assert [w for w, _ in fused] == [256, 256, 128]
    for width, layout in fused:
        alone = reduced(
            norms._rms_norm_kernel,
            dict(x_ptr=BF, w_ptr=BF, y_ptr=BF, rows="i32", eps="fp32", stride_x="i32"),
            dict(D=width, G=width, BLOCK=width, PDL=1),
            norms._warps(width),
        )
        assert alone == [(width, layout)]


def _softmax_ir(layout: bool, stride_on_16: bool, sort_block: int | None = None) -> list[str]:
    """The pick's softmax in _route_kernel's TTGIR for sm_90 (from the logits' load to the
    divide), with SSA names, locations and layout names taken out."""
    import re

    from flashlane.kernels.moe import routing

    fn, signature, constexprs, options = KERNELS[
        "moe route with the layout" if layout else "moe route"
    ]
    if sort_block is not None:  # the layout's pairs a launch sorts (routing.sort_block)
        constexprs = dict(constexprs, BLOCK_S=sort_block)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3 + stride_on_16)}
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=H200,
        options=dict(options, num_warps=routing.ROUTE_WARPS),
    )
    lines = compiled.asm["ttgir"].splitlines()
    start = next(i for i, s in enumerate(lines) if "tt.load" in s and "512x!tt.ptr<f32>" in s)
    end = next(i for i, s in enumerate(lines) if "arith.divf" in s and "512xf32" in s)
    layouts = dict(re.findall(r"^(#\w+) = (#ttg\.blocked<.*>)$", compiled.asm["ttgir"], re.M))
    out = []
    for s in lines[start : end + 1]:
        s = re.sub(r"loc\([^()]*(\([^()]*\))?[^()]*\)", "", s)
        s = re.sub(r"%[\w.]+", "%v", s)
        out.append(re.sub(r"#blocked\d*", lambda m: layouts.get(m.group(0), m.group(0)), s))
    return out


def test_the_picks_softmax_is_one_variant_with_and_without_the_layout():
    """The pick's weights must not depend on the rows beside them: decode rounds pick with
    the layout in the same launch (routing.pick_and_lay_out), rounds of more than
    FUSED_DISPATCH_MAX_PAIRS pairs without it. The softmax (load, max, exp, sum, divide)
    compiles to the same ops in the same layout either way. A row stride that 16 does not
    divide would load one value a thread instead of four and sum in another order (issue
    28's served reply): pick_experts never passes one, and this shows the difference."""
    plain = _softmax_ir(layout=False, stride_on_16=True)
    assert plain == _softmax_ir(layout=True, stride_on_16=True)
    # the layout's sort is sized by the round's pairs (16 to 1,024): one softmax for all
    for pairs in (16, 64, 1024):
        assert plain == _softmax_ir(layout=True, stride_on_16=True, sort_block=pairs), pairs
    assert any("sizePerThread = [4]" in s for s in plain)
    assert plain != _softmax_ir(layout=False, stride_on_16=False)


@pytest.mark.parametrize("name", sorted(n for n in GEMMS if n.startswith(("linear", "moe"))))
def test_gemms_keep_their_registers(name):
    """The linear's and the MoE's kernels, as a typical launch specialises them, hold their
    tiles, pointers and masks in registers: no local-memory store or load in the SASS (a
    spill puts a memory round trip into the K loop; the MoE's prefill gate-up compiled
    without the launch's alignment had 96 of each)."""
    import re

    spills = re.findall(r"\b(STL|LDL)\b", sass(compiles_for_sm90(GEMMS[name], aligned=True)))
    assert not spills, f"{len(spills)} local-memory accesses"


def test_in_loops_reads_the_lines_between_a_label_and_its_branch_back():
    """sass_census's `in_loop` column: a backward branch makes a loop (nested ones count
    once), a forward branch does not."""
    code = "\n".join(
        [
            "        /*0000*/   STL [R1], R0 ;",
            ".L_x_0:",
            "        /*0010*/   LDL R2, [R1] ;",
            ".L_x_1:",
            "        /*0020*/   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;",
            "        /*0030*/   @P0 BRA `(.L_x_1) ;",
            "        /*0040*/   @!P1 BRA `(.L_x_2) ;",
            "        /*0050*/   BRA `(.L_x_0) ;",
            "        /*0060*/   STL [R1+0x4], R3 ;",
            ".L_x_2:",
            "        /*0070*/   STG.E [R6.64], R4 ;",
        ]
    )
    inside = in_loops(code)
    assert [line.split("*/")[1].split()[0] for line in inside] == [
        "LDL",
        "HMMA.16816.F32.BF16",
        "@P0",
        "@!P1",
        "BRA",
    ]


def test_a_gemms_k_loop_holds_its_products_and_not_its_stores():
    code = sass(compiles_for_sm90(GEMMS["linear prefill 128x128"], aligned=True))
    inside = "\n".join(in_loops(code))
    assert code.count("MMA") and inside.count("MMA") == code.count("MMA")  # HGMMA: wgmma
    assert code.count("STG") and "STG" not in inside


@pytest.mark.parametrize(
    "name",
    ["attention listed: fold", "attention listed: fold fp8", "attention gathered",
     "attention gathered fp8"],
)  # fmt: skip
def test_gathering_attention_loads_rows_whole_and_keeps_its_loop_in_registers(name):
    """Decode's attention over listed or gathered keys reads each session's rows through the
    table's offsets, whole multiples of 16 elements (session_tables.offsets_table): the
    compiler then copies a key's row 8-16 bytes a thread, asynchronously. Without the hint
    it loaded 1-2 bytes a thread and kept the addresses in local memory inside the key loop
    (the 8-bit fold: 105 local accesses there, 7,224 instructions)."""
    code = sass(compiles_for_sm90(ATTENTION_KERNELS[name], aligned=True))
    looped = "\n".join(in_loops(code))
    assert "STL" not in looped and "LDL" not in looped
    assert code.count("LDGSTS.E.BYPASS.128" if "fp8" not in name else "LDGSTS.E.64") >= 12

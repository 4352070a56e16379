"""benchmarks/fp8_gluon.py's experiment compiles for the H200 (sm_90) on any machine, as
test_sm90_compile_fp8.py's kernels: through ptxas, within the shared memory, without local
memory, and with what it is for: inside its K loop a block's wgmma waits with one group
still in flight (`wgmma.wait_group 1`), where triton_fp8's prompt tile waits for none.

    python -m pytest tests/kernels/test_sm90_compile_gluon.py     # needs triton; no GPU
"""

from __future__ import annotations

import os
import re

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from benchmarks import fp8_gluon  # noqa: E402
from tests.kernels.sm90 import H200, H200_SHARED  # noqa: E402


def _compile(tile: dict, parts: int, blocks_per_part: int):
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    x = torch.empty(256, 2048, dtype=torch.float8_e4m3fn)
    descs = fp8_gluon.descriptors(x, x, tile["BLOCK_M"], tile["BLOCK_N"])
    blocks = {k: v for k, v in tile.items() if k != "PER_SM"}  # PER_SM: the grid's
    consts = dict(PARTS=parts, BLOCKS_PER_PART=blocks_per_part, **blocks)
    sig = dict(x_desc=mangle_type(descs[0]), q_desc=mangle_type(descs[1]), xs_ptr="*fp32",
               s_ptr="*fp32", y_ptr="*bf16", M="i32", N="i32", KB="i32", KS="i32",
               stride_y="i32", **dict.fromkeys(consts, "constexpr"))  # fmt: skip
    src = GluonASTSource(fn=fp8_gluon._fp8_prompt_kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=H200, options=dict(num_warps=tile["num_warps"]))


@pytest.mark.parametrize("tile", fp8_gluon.TILES, ids=lambda t: "x".join(map(str, t.values())))
@pytest.mark.parametrize("parts", [1, 3])
def test_gluon_prompt_tile_overlaps_its_k_blocks(tile, parts):
    compiled = _compile(tile, parts, 8)
    ptx = compiled.asm["ptx"]
    assert len(compiled.asm["cubin"]) > 0 and compiled.metadata.shared <= H200_SHARED
    assert not re.search(r"\.local", ptx)  # no spills
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    # every partition's loop waits for the block before with its own in flight, and its last
    # block drains
    assert waits.count("1") == parts and waits.count("0") == parts, waits
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx)

"""Compiling a Triton kernel for the H200 (sm_90) on any machine, through ptxas (bundled with
triton), without a GPU: the tables of test_sm90_compile*.py name a kernel, its arguments'
types, its constexprs and launch options; test_sm90_codegen.py reads what comes out."""

from __future__ import annotations

import re

from triton.backends.compiler import GPUTarget

H200 = GPUTarget("cuda", 90, 32)
H200_SHARED = 232448  # the shared memory one program may take on the H200, bytes
BF = "*bf16"


def blocks(tile: dict) -> dict:
    return {k: v for k, v in tile.items() if k.isupper()}


def launch(tile: dict) -> dict:
    return {k: v for k, v in tile.items() if not k.isupper()}


def launch_attrs(fn, args: dict) -> dict:
    """The attrs of a typical launch of `fn` at Flash Next's sizes: its pointers 16-byte
    aligned (torch allocates so) and its integers that Triton specialises (those not in
    do_not_specialize) multiples of 16, as the model's widths, strides and prefill rows are.
    Triton specialises a launch on both, and its loads vectorise only then: a kernel compiled
    without them is not the code that runs (the MoE's prefill gate-up so compiled had 2-byte
    scalar loads and local-memory spills; launched, 16-byte async copies and none)."""
    names = list(fn.arg_names)
    fixed = {names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    return {
        (names.index(a),): [["tt.divisibility", 16]]
        for a, t in args.items()
        if t[0] == "*" or (t in ("i32", "i64") and a not in fixed)
    }


def compiles_for_sm90(entry: tuple, aligned: bool = False):
    """A table entry (fn, args, constexprs[, options]) compiles to a binary the H200 would
    load, within the shared memory one program may take; aligned: specialised as a typical
    launch is (`launch_attrs`). -> the compiled kernel."""
    import triton
    from triton.compiler import ASTSource

    fn, args, constexprs, *options = entry
    signature = {**args, **dict.fromkeys(constexprs, "constexpr")}
    attrs = launch_attrs(fn, args) if aligned else None
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=H200,
        options=options[0] if options else None,
    )
    assert len(compiled.asm["cubin"]) > 0  # through ptxas: a binary the H200 would load
    assert compiled.metadata.shared <= H200_SHARED  # else the launch fails (out of resources)
    return compiled


def sass(compiled) -> str:
    """A compiled kernel's SASS, through the nvdisasm bundled with triton."""
    import subprocess
    import tempfile

    from triton.knobs import nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run(
            [nvidia.nvdisasm.path, "-c", f.name], capture_output=True, text=True, check=True
        ).stdout


def in_loops(code: str) -> list[str]:
    """The instruction lines of SASS `code` that lie inside a loop: between a label and a
    branch back to it (nested loops count once)."""
    lines = code.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\.L\w+):", line))}
    inside = [False] * len(lines)
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L\w+)\)", line)
        if m and labels.get(m.group(1), len(lines)) < i:
            for j in range(labels[m.group(1)], i + 1):
                inside[j] = True
    return [line for line, kept in zip(lines, inside) if kept and "/*" in line]

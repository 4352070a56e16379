"""Compiling a Triton kernel for the H200 (sm_90) on any machine, through ptxas (bundled with
triton), without a GPU: the tables of test_sm90_compile*.py name a kernel, its arguments'
types, its constexprs and launch options; test_sm90_codegen.py reads what comes out."""

from __future__ import annotations

from triton.backends.compiler import GPUTarget

H200 = GPUTarget("cuda", 90, 32)
H200_SHARED = 232448  # the shared memory one program may take on the H200, bytes
BF = "*bf16"


def blocks(tile: dict) -> dict:
    return {k: v for k, v in tile.items() if k.isupper()}


def launch(tile: dict) -> dict:
    return {k: v for k, v in tile.items() if not k.isupper()}


def compiles_for_sm90(entry: tuple) -> None:
    """A table entry (fn, args, constexprs[, options]) compiles to a binary the H200 would
    load, within the shared memory one program may take."""
    import triton
    from triton.compiler import ASTSource

    fn, args, constexprs, *options = entry
    signature = {**args, **dict.fromkeys(constexprs, "constexpr")}
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs),
        target=H200,
        options=options[0] if options else None,
    )
    assert len(compiled.asm["cubin"]) > 0  # through ptxas: a binary the H200 would load
    assert compiled.metadata.shared <= H200_SHARED  # else the launch fails (out of resources)

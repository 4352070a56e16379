"""Triton 3.6's interpreter re-patches triton.language at every call of a nested @triton.jit
helper (InterpretedFunction.__call__ -> _patch_lang: ~1.3 ms of inspect.getmembers), though
the kernel's launch (GridExecutor) has patched the same modules for the whole grid. A kernel
that calls a helper in a loop paid this at every iteration: a third of the interpreter's time
on the embedded model's forward (cProfile, 2026-12-05). `install()` skips a nested call's
patch where the launch's patch already covers the helper's modules; the patches are the same
(the one interpreter builder), so the results are too. (A helper's own modules, such as
triton.language.core for tl.sum, are patched at its first call in a launch: Triton never
restores a nested call's patch.) Anything unexpected in Triton's
internals leaves the interpreter as it is.
"""

from __future__ import annotations

import inspect


def install() -> bool:
    """Patch once per launch; True where installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as it

        original, scope_cls = it._patch_lang, it._LangPatchScope
    except (ImportError, AttributeError):
        return False
    if getattr(original, "flashlane_once", False):
        return True
    covered: set[int] = set()  # the language modules the running launch patched
    inside = [False]

    def langs(fn) -> set[int]:
        return {
            id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)
        }

    def patch(fn):
        mine = langs(fn)
        if inside[0] and mine <= covered:
            return scope_cls()  # nothing patched, nothing to restore
        scope = original(fn)
        if inside[0]:  # a helper's modules the launch did not patch: Triton never restores
            covered.update(mine)  # a nested call's patch, so they stay patched
        else:  # a launch's own patch: GridExecutor restores it in a finally
            inside[0] = True
            covered.update(mine)
            restore = scope.restore

            def done():
                try:
                    restore()
                finally:
                    covered.clear()
                    inside[0] = False

            scope.restore = done
        return scope

    patch.flashlane_once = True
    it._patch_lang = patch
    return True

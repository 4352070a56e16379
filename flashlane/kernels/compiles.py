"""How many Triton kernels this process has compiled.

A call in which a kernel compiled (a shape's first specialisation, a first use) timed the
compiler, not the work, so timings that steer choices skip it (runner/lone.py: the lone
driver's step and load times, which the depth rule prices). Counted by Triton's
post-compile hook, chained to any hook already set; without Triton (or under its
interpreter, which compiles nothing) the count stays 0. `since` names what compiled after a
count: a served round that met a shape the warm rounds did not (server/stats_log.py).
"""

from __future__ import annotations

_count = 0
_installed = False
# the last compiles' (kernel name, its specialisation: `_spec`)
_recent: list[tuple[str, str]] = []
_RECENT = 256
# every specialisation each kernel compiled, in order (a kernel has a few)
_variants: dict[str, list[str]] = {}


def count() -> int:
    """Triton compiles so far in this process (from the first call on)."""
    _install()
    return _count


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing compiles
        return
    before = knobs.runtime.jit_post_compile_hook

    def counted(**info):
        global _count
        _count += 1
        name = getattr(info.get("fn"), "name", "?")
        spec = _spec(name, info.get("compile") or {})
        _recent.append((name, spec))
        del _recent[:-_RECENT]
        _variants.setdefault(name, []).append(spec)
        return before(**info) if before is not None else None

    knobs.runtime.jit_post_compile_hook = counted


def since(before: int) -> list[tuple[str, str]]:
    """(name, `_spec`) of the compiles after `before` (a `count()`), at most the last 256."""
    return _recent[len(_recent) - min(len(_recent), max(0, _count - before)) :]


def earlier(name: str, spec: str) -> list[str]:
    """The specialisations `name` compiled before its last compile of `spec`: what a shape
    met while serving differs from (`spec` itself among them where the same specialisation
    compiled again: a new kernel object or a key this line does not show)."""
    seen = _variants.get(name, [])
    return seen[: len(seen) - 1 - seen[::-1].index(spec)] if spec in seen else list(seen)


def _spec(name: str, compiled: dict) -> str:
    """A compile's specialisation on one line: its constants (constexprs and the integers
    specialised to 1) and the arguments it took as divisible by 16, which tell which of a
    kernel's variants a shape met (Triton's own repr runs over several lines)."""
    names = list(compiled.get("signature") or {})

    def arg(key):
        i = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        return names[i] if isinstance(i, int) and 0 <= i < len(names) else i

    constants = {arg(k): v for k, v in (compiled.get("constants") or {}).items()}
    div16 = sorted(str(arg(k)) for k in (compiled.get("configs") or [{}])[0])
    types = [f"{k}:{t}" for k, t in (compiled.get("signature") or {}).items() if t != "constexpr"]
    extra = {k: compiled[k] for k in ("num_ctas", "enable_fp_fusion") if k in compiled}
    return (
        f"{name} warps={compiled.get('num_warps')} stages={compiled.get('num_stages')} "
        + "".join(f"{k}={v} " for k, v in extra.items())
        + f"constants={constants} div16={div16} args={','.join(types)}"
    )

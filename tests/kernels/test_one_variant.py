"""One compiled variant per kernel call site whatever the rows (DESIGN.md section 1).

Triton compiles a kernel once per specialisation of its arguments: an int by whether 16
divides it and whether it is 1, a pointer by whether 16 divides its address (unless the
kernel lists the argument in do_not_specialize). Another variant can load in other widths
and reduce in another order: on the H200 one row of the router's padded product reached the
pick with row stride 513 and two rows with 528, the pick's softmax summed in another order,
and a served reply parted from its alone reply (issue 28; fixed in linear's `shaped` and in
`pick_experts`). This test runs the tiny model's shared forward and its lone step with one
stream and with several, through Triton's interpreter, records each launch's
specialisation, and requires the same set of them per kernel for one stream and for two.

Known differences that cannot change a bit are listed with the reason; anything else fails.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_one_variant.py`.
"""

from __future__ import annotations

import collections
import inspect
import os
import sys

import pytest
import torch

from tests.kernels.triton_env import needs_triton

pytestmark = [
    *needs_triton,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's hook"),
]

# (kernel, argument): why its specialisation may follow the rows without changing a bit
HARMLESS = {
    ("_attention_kernel", "pos_ptr"): "positions are loaded as integers and only compared",
    ("_gather_kernel", "pos_ptr"): "positions are loaded as integers and only compared",
    ("_select_kernel", "pos_ptr"): "positions are loaded as integers and only compared",
    ("_spread_kernel", "pos_ptr"): "positions are loaded as integers and only compared",
    ("_index_scores_kernel", "pos_ptr"): "positions are loaded as integers and only compared",
    ("_cos_sin_kernel", "pos_ptr"): "elementwise: each angle from its own position",
    ("_causal_conv_kernel", "stride_xb"): "taps added one by one in a static loop",
    ("_causal_conv_kernel", "stride_xt"): "taps added one by one in a static loop",
    ("_accept_kernel", "B"): "the verdict only compares integer ids",
    ("_put_from_two_kernel", "start1"): "a copy: start positions read as integers",
}


def _site() -> str:
    """The innermost flashlane function outside kernels/ that launched."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/flashlane/" in path and "/flashlane/kernels/" not in path:
            return path.split("/flashlane/")[-1] + ":" + frame.f_code.co_name
        frame = frame.f_back
    return "?"


def _specialisation(fn, args, kwargs) -> tuple:
    sig = inspect.signature(fn.fn)
    fixed = set(fn.kwargs.get("do_not_specialize") or ())
    given = {k: v for k, v in kwargs.items() if k in sig.parameters}
    out = []
    for name, value in sig.bind_partial(*args, **given).arguments.items():
        if "constexpr" in str(sig.parameters[name].annotation) or name in fixed:
            continue
        if (fn.fn.__name__, name) in HARMLESS or isinstance(value, bool):
            continue
        if isinstance(value, int):
            out.append((name, value % 16 == 0, value == 1))
        elif isinstance(value, torch.Tensor):
            out.append((name, value.data_ptr() % 16 == 0))
    return tuple(out)


class Variants:
    """Records {(call site, kernel): {specialisation}} of the launches inside `with`."""

    def __init__(self):
        from triton.runtime import interpreter

        self.interpreter = interpreter
        self.seen: dict[tuple[str, str], set] = collections.defaultdict(set)
        self.inside = False

    def __enter__(self):
        original = self.original = self.interpreter.InterpretedFunction.run

        def run(fn, *args, **kwargs):
            if self.inside:  # a kernel's interpreted body
                return original(fn, *args, **kwargs)
            self.seen[(_site(), fn.fn.__name__)].add(_specialisation(fn, args, kwargs))
            self.inside = True
            try:
                return original(fn, *args, **kwargs)
            finally:
                self.inside = False

        self.interpreter.InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        self.interpreter.InterpretedFunction.run = self.original


@pytest.fixture(scope="module")
def tiny():
    from flashlane.kernels.gpu import TRITON
    from flashlane.models.presets import preset
    from flashlane.models.random_weights import build_random

    cfg, model = build_random(preset("flashnext-tiny"), torch.float32, "cpu", 0)
    model.use_kernels(TRITON)
    return cfg, model


# the prefilled sessions, made once (each prefill is ~15 s through the interpreter) and
# copied for every use: steps write into their sessions
_PREFILLED: dict[int, list] = {}


def _sessions(cfg, model, n: int) -> list:
    import copy

    from flashlane.models.flashnext import run_piece
    from flashlane.models.state import SessionState

    made = _PREFILLED.setdefault(id(model), [])
    for i in range(len(made), n):
        s = SessionState.empty(cfg, 256, torch.float32, torch.float32, "cpu")
        run_piece(model, s, torch.arange(3, 23 + 5 * i), 0, recurrent=False)
        made.append(s)
    return [copy.deepcopy(s) for s in made[:n]]


def _shared(cfg, model, n: int, width: int) -> dict:
    from flashlane.models.rows import Rows

    sessions = _sessions(cfg, model, n)
    rows = Rows.of([(s, torch.arange(5, 5 + width), s.length, True) for s in sessions], "cpu")
    with torch.no_grad(), Variants() as v:
        model.logits(model.residual(rows))
    return v.seen


def _lone(cfg, model, n: int) -> dict:
    from flashlane.runner import lone

    sessions = _sessions(cfg, model, n)
    tok = torch.full((n,), 5)
    pos = torch.tensor([s.length for s in sessions])
    out, keep = torch.zeros(n, 2, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    rows = torch.zeros(4, n, cfg.hc_count * cfg.hidden_size)
    with torch.no_grad(), Variants() as v:
        lone.step(model, sessions, tok, pos, out, (rows, keep))
    return v.seen


def _drafted(cfg, model, n: int, depth: int = 2) -> dict:
    """n sessions' drafted lone step, named by size tables as its graph names it
    (benchmarks/launch_census.py's drafted_step for n sessions)."""
    from flashlane.runner.draft_step import DraftBuffers
    from flashlane.runner.lone_buffers import SizeTables

    sessions = _sessions(cfg, model, n)
    sizes = SizeTables(cfg, sessions, 8 * (depth + 1), torch.device("cpu"))
    width = cfg.hc_count * cfg.hidden_size
    io = DraftBuffers(n, depth, cfg.hc_count, width, torch.float32, torch.device("cpu"))
    io.table = sizes.of(tuple(range(n)), n, depth).clone()
    io.table_keys = sizes.draft_keys
    io.tok.fill_(5)
    io.pos.copy_(torch.tensor([s.length for s in sessions]))
    with torch.no_grad(), Variants() as v:
        io.step(model, [sizes.anchor], io.tables())
    return v.seen


def _differences(one: dict, many: dict) -> list[str]:
    """Kernels launched in both runs whose specialisations differ. A kernel's launches are
    pooled over its call sites: one window and several take different paths to the same
    kernels (qsa_attention's _attend and _attend_windows), and one stream skips or adds a
    launch (moe's dispatch, the lone step's puts); that each path keeps the bits is the
    exactness tests' part (tests/gpu, tests/runner)."""

    def by_kernel(seen: dict) -> dict:
        pooled = collections.defaultdict(set)
        for (_, kernel), specs in seen.items():
            pooled[kernel] |= specs
        return pooled

    a, b = by_kernel(one), by_kernel(many)
    both = sorted(set(a) & set(b))
    return [f"{k}: one stream {a[k]}, several {b[k]}" for k in both if a[k] != b[k]]


@pytest.mark.parametrize("width", [1, 3])
def test_shared_rounds_compile_one_variant_for_one_stream_and_many(tiny, width):
    cfg, model = tiny
    one = _shared(cfg, model, 1, width)
    assert one, "no launch recorded: the hook missed the kernels"
    assert not _differences(one, _shared(cfg, model, 2, width))


def test_lone_steps_compile_one_variant_for_one_stream_and_many(tiny):
    cfg, model = tiny
    one = _lone(cfg, model, 1)
    assert one, "no launch recorded: the hook missed the kernels"
    assert not _differences(one, _lone(cfg, model, 2))


def test_drafted_steps_compile_one_variant_for_one_stream_and_many(tiny):
    cfg, model = tiny
    one = _drafted(cfg, model, 1)
    assert one, "no launch recorded: the hook missed the kernels"
    assert not _differences(one, _drafted(cfg, model, 2))

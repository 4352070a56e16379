"""A plan that serves one reply at a time says which shorter --context serves more
(planning/shorter.py): in the plan, the engine's summary and `flashlane info`."""

from __future__ import annotations

from flashlane.cli import main
from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig
from flashlane.models.fp8 import QuantSpec
from flashlane.models.weight_bytes import fp8_bytes
from flashlane.planning.info_plan import H200_BYTES
from flashlane.planning.memory import (
    plan_fitting,
    resolve_limit_bytes,
    resolve_prompt_cache_bytes,
)
from flashlane.planning.shorter import shorter_note, with_shorter
from tests import DATA

REAL = DATA / "flashnext_real_config.json"


def _planner(real: ModelConfig):
    """The real Flash Next in FP8 on an H200, tables in host memory, default flags but the
    context (test_memory.py's plan)."""
    limit = resolve_limit_bytes(None, {}, "cuda", H200_BYTES)
    weights = fp8_bytes(real, QuantSpec()).total_bytes - 2 * count_params(real).ngram_table
    cache = resolve_prompt_cache_bytes(None, "cuda", limit)

    def at(context: int):
        return plan_fitting(real, device="cuda", limit_bytes=limit, weight_bytes=weights,
                            context=context, max_rows=64, window_rows=9, prompt_rows=8192,
                            prompt_cache_bytes=cache, prompt_cache_auto=True)  # fmt: skip

    return at


def test_the_real_model_names_the_contexts_that_serve_more(real: ModelConfig) -> None:
    at = _planner(real)
    whole = at(262_144)
    assert whole.serial and not whole.shorter
    got = with_shorter(whole, at, sized=False)
    assert got.capacities == whole.capacities and got.serial  # the plan itself unchanged
    contexts = [c for c, _ in got.shorter]
    assert contexts == sorted(contexts, reverse=True) and max(contexts) < 262_144
    assert (32_768, at(32_768).num_sessions) in got.shorter
    assert dict(got.shorter)[32_768] == 9  # test_memory.py's 9 sessions of 32k (16-bit KV)
    assert all(n >= 2 for _, n in got.shorter)
    note = shorter_note(got)
    assert note.startswith("one reply at a time: --context ") and "32768 gives 9" in note


def test_no_note_where_sizes_were_given_or_two_sessions_fit(real: ModelConfig) -> None:
    at = _planner(real)
    assert with_shorter(at(262_144), at, sized=True).shorter == ()
    two = at(32_768)
    assert not two.serial and with_shorter(two, at, sized=False).shorter == ()
    assert shorter_note(two) is None


def test_info_prints_the_shorter_sessions(capsys) -> None:
    """`flashlane info` on the real config with the tables on a GPU that holds one session."""
    args = [
        "info", str(REAL), "--quantization", "fp8", "--ple-table-device", "cuda",
        "--memory-limit-gb", "226",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "sessions           1 (auto): 262144 tokens" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("shorter sessions"))
    assert "--context 131072 gives " in line and "32768 gives " in line
    assert main([*args, "--context", "262144"]) == 0
    assert "shorter sessions" not in capsys.readouterr().out


def test_the_engine_summary_names_them() -> None:
    """The embedded model on the CPU under a ceiling that holds one session of its window:
    the start-up summary says which --context serves more, and a session of it fits."""
    from flashlane.config import EngineConfig
    from flashlane.engine import Engine
    from flashlane.planning.memory import GIB

    logged: list[str] = []
    one = Engine(
        EngineConfig.resolve(device="cpu", parallel=1, prompt_cache_gb=0), log=logged.append
    )
    p = one.plan
    room = p.weight_bytes + p.workspace_bytes + 1.5 * p.session_bytes[0]
    config = EngineConfig.resolve(device="cpu", prompt_cache_gb=0, memory_limit_gb=room / GIB)
    logged.clear()
    eng = Engine(config, log=logged.append)
    assert eng.plan.serial and eng.plan.capacities == p.capacities
    note = next(x for x in "\n".join(logged).splitlines() if x.strip().startswith("note"))
    context, n = eng.plan.shorter[0]
    assert f"--context {context} gives {n} sessions" in note and n >= 2
    shorter = EngineConfig.resolve(
        device="cpu", prompt_cache_gb=0, memory_limit_gb=room / GIB, context=context
    )
    assert Engine(shorter, log=logged.append).plan.num_sessions == n  # what the note said

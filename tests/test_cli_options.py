"""Engine options a user gets wrong or leaves out (issue 30, item 7): an empty --slot-contexts is
refused, the default --slot-grow never refuses small sessions, and `flashlane info` plans under
the same ceiling as the engine (FLASHNEXT_LOAD_LIMIT_GB)."""

from __future__ import annotations

import pytest

from flashlane.cli import main
from flashlane.config import DEFAULT_MODEL
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM

COSTS = CostTable({1: 10.0, 8: 14.0, 16: 20.0}, draft_step_ms=3.0, overhead_ms=1.0)


def test_an_empty_slot_contexts_is_refused():
    with pytest.raises(ValueError, match="--slot-contexts is empty"):
        LLM(costs=COSTS, slot_contexts="")
    assert main(["info", str(DEFAULT_MODEL), "--device", "cpu", "--slot-contexts", " "]) == 2


def test_the_default_slot_grow_takes_sessions_below_it(capsys):
    llm = LLM(costs=COSTS, slot_contexts="2048,1024", max_rows=16)
    assert llm.engine.plan.capacities == (2048, 1024)
    assert "--slot-grow" not in capsys.readouterr().err


def test_info_plans_under_the_load_limit(monkeypatch, capsys):
    args = ["info", str(DEFAULT_MODEL), "--device", "cpu", "--context", "8192"]
    assert main(args) == 0
    roomy = capsys.readouterr().out
    assert "16 (auto)" in roomy
    # 0.35 GiB holds the weights, the workspace, the cache's share of it and a few sessions
    monkeypatch.setenv("FLASHNEXT_LOAD_LIMIT_GB", "0.35")
    assert main(args) == 0
    tight = capsys.readouterr().out
    sessions = next(line for line in tight.splitlines() if line.strip().startswith("sessions "))
    assert "(auto)" in sessions and "x16" not in sessions
    monkeypatch.setenv("FLASHNEXT_LOAD_LIMIT_GB", "0.1")
    assert main(args[:4]) == 2  # the env alone asks for a plan, and it does not fit
    assert "--prompt-cache-gb" in capsys.readouterr().err


def test_info_plans_an_8bit_cache(monkeypatch, capsys):
    """--kv-cache-dtype fp8: the plan says so and fits more sessions under the same limit."""
    args = ["info", str(DEFAULT_MODEL), "--device", "cpu", "--context", "32768"]
    monkeypatch.setenv("FLASHNEXT_LOAD_LIMIT_GB", "1.5")

    def sessions(extra: list[str]) -> tuple[int, str]:
        assert main(args + extra) == 0
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("sessions "))
        return int(line.split()[1]), out

    plain, out = sessions([])
    eight, out8 = sessions(["--kv-cache-dtype", "fp8"])
    header = [
        next(ln for ln in o.splitlines() if ln.startswith("memory plan")) for o in (out, out8)
    ]
    assert "e4m3" in header[1] and "e4m3" not in header[0]
    assert eight > plain >= 1

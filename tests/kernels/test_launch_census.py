"""A guard on the decode step's launch count: the tiny model's lone step, counted by
benchmarks/launch_census.py through Triton's interpreter, stays within its budget (each
launch is a slot of a CUDA graph, 1-3 us on the H200 however small its work).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_launch_census.py`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.kernels.triton_env import needs_triton

pytestmark = needs_triton

BUDGET = 92  # 583 at 7a78073, 102 at b40f7c7, 89 at 01616f3
# a drafted step of depth 2 (runner/draft_step.py): 240 at 225da56, 218 with the plain step's
# fused reads, angles and head, 204 with each commit one launch (kernels.put_sessions_from),
# 199 with the kept rows picked by index_select into the buffers, 186 with the verdict in one
# launch (kernels.accept_window), 183 with the GDN conv reading the windows in place, 165
# with the MTP cells' picks, embedding norms and sums fused, the tables' and window's
# copies gone and the GDN rule reading the states in place, 161 with a layer's two
# commits in one launch, 160 with the kept cells' norms gathering their rows, 159 with
# the hand-off residual kept by the window cells' norm, 158 with the window positions
# written by step_angles, 157 with the PLE ids gathered with the window appended, 156
# with the PLE conv reading each session's tail in place, 155 with the window rows' tables
# made on the host (SizeTables.of), 154 with each row's draw made in the verdict's launch,
# 153 with the mixer's norm of the kept cells made by the window cells' last write, 148 with
# each MoE's pairs laid out in its pick's launch
DRAFTED_BUDGET = 148
# depths 1 and 3 (30 launches a depth: one chained MTP cell and its pick): 126 and 186
# at 226db76
DRAFTED_BUDGETS = {1: 118, 2: DRAFTED_BUDGET, 3: 178}


def _census(args: list[str], capsys) -> int:
    path = Path(__file__).parents[2] / "benchmarks" / "launch_census.py"
    spec = importlib.util.spec_from_file_location("launch_census", path)
    census = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census)
    argv = sys.argv
    sys.argv = ["launch_census.py", "--config", "flashnext-tiny", *args]
    try:
        census.main()
    finally:
        sys.argv = argv
    first = capsys.readouterr().out.splitlines()[0]
    launches = int(first.split(": ")[1].split()[0])
    assert launches > 0, first
    return launches


ON_CPU = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts on the CPU")


@ON_CPU
def test_absorbing_more_streams_launches_no_more(capsys):
    """A drafted lone call's load (the MTP head absorbing its streams' waiting cells in one
    forward) launches as many kernels for 5 streams as for 2: the blocks their prompts
    complete are pooled in one launch for all (qsa_attention's _complete_all). On the H200
    that load grew 0.65 ms a stream (2.7 / 5.5 / 10.8 ms at 1 / 4 / 16, e97e8a5)."""
    assert _census(["--absorb", "5"], capsys) == _census(["--absorb", "2"], capsys)


@ON_CPU
def test_a_round_of_short_prompts_launches_as_many_for_more(capsys):
    """Short whole prompts in one round share their GDN layers' conv, heads and recurrent
    rule (gated_deltanet's _short), their attention's pooled blocks, their PLE layers
    (Rows.stack_in, from PROMPTS_TOGETHER on) and their resets: 6 prompts launch as many
    kernels as 3 (28 more a prompt at 22ddfd9: 168 / 252 / 336 for 2 / 5 / 8)."""
    assert _census(["--prompts", "6"], capsys) == _census(["--prompts", "3"], capsys)


@ON_CPU
@pytest.mark.parametrize("depth,budget", [(0, BUDGET), *DRAFTED_BUDGETS.items()])
def test_tiny_lone_step_launches_within_budget(capsys, depth, budget):
    assert _census(["--depth", str(depth)], capsys) <= budget

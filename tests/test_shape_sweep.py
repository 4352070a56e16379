"""The shape sweep on the CPU (issue 26): each of tests/sweep_configs.py's seeded small
qwen4_exp configs against the transformers oracle (logits within 1e-4 of the largest, greedy
continuations) and exact across batching and drafting (tests/shape_sweep.py). CI runs 20
configs, 8 streams, 24 tokens (46 s on an idle 2-core machine); the `slow` variant 40 more
configs with 12 streams and 40 tokens.
Drafts are tried wherever the config has an MTP head (copy drafts rarely find a match in a
random model's replies)."""

import pytest

from tests import shape_sweep
from tests.sweep_configs import sweep_configs

SPECS = sweep_configs(60)


def run(tmp_path, i, sweep):
    drafted = shape_sweep.check(tmp_path, SPECS[i], i, sweep)
    assert drafted > 0 or not SPECS[i]["mtp_num_hidden_layers"]


@pytest.mark.parametrize("i", range(20), ids=[shape_sweep.describe(s) for s in SPECS[:20]])
def test_config(tmp_path, i):
    run(tmp_path, i, shape_sweep.SHORT)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(20, 60), ids=[shape_sweep.describe(s) for s in SPECS[20:]])
def test_config_full(tmp_path, i):
    run(tmp_path, i, shape_sweep.FULL)

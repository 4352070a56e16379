"""The shape sweep on the CPU (issue 26): each of tests/sweep_configs.py's seeded small
qwen4_exp configs against the transformers oracle (logits within 1e-4 of the largest, greedy
continuations) and exact across batching and drafting (tests/shape_sweep.py). CI runs 20
configs, 8 streams, 24 tokens (46 s on an idle 2-core machine); the `slow` variant 40 more
configs with 12 streams and 40 tokens.
Drafts are tried wherever the config has an MTP head (copy drafts rarely find a match in a
random model's replies). The siblings (issue 33: Qwen3-Next, Qwen3.5-MoE, Qwen3.5 dense) get
the same checks against their own transformers classes: 6 configs in CI (34 s), 18 more slow."""

import pytest

from tests import shape_sweep
from tests.sweep_configs import sibling_configs, sweep_configs

SPECS = sweep_configs(60)
# issue 33: the siblings' shapes through the same checks (their transformers classes)
SIBLING_SPECS = sibling_configs(24)


def run(tmp_path, i, sweep, specs=SPECS):
    drafted = shape_sweep.check(tmp_path, specs[i], i, sweep)
    assert drafted > 0 or not specs[i]["mtp_num_hidden_layers"]


@pytest.mark.parametrize("i", range(20), ids=[shape_sweep.describe(s) for s in SPECS[:20]])
def test_config(tmp_path, i):
    run(tmp_path, i, shape_sweep.SHORT)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(20, 60), ids=[shape_sweep.describe(s) for s in SPECS[20:]])
def test_config_full(tmp_path, i):
    run(tmp_path, i, shape_sweep.FULL)


@pytest.mark.parametrize("i", range(6), ids=[shape_sweep.describe(s) for s in SIBLING_SPECS[:6]])
def test_sibling_config(tmp_path, i):
    run(tmp_path, i, shape_sweep.SHORT, SIBLING_SPECS)


@pytest.mark.slow
@pytest.mark.parametrize(
    "i", range(6, 24), ids=[shape_sweep.describe(s) for s in SIBLING_SPECS[6:]]
)
def test_sibling_config_full(tmp_path, i):
    run(tmp_path, i, shape_sweep.FULL, SIBLING_SPECS)

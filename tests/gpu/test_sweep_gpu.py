"""Issue 26's shape sweep on the GPU: every seeded random config of tests/sweep_configs.py
served alone, batched, drafted, resumed and moved gives the same replies, bit for bit
(Triton kernels, CUDA graphs, bf16). Four configs here (hc_count 3, 5, 2, 4; about 40 s
each on the H200); `benchmarks/shape_sweep.py` (gpu_check.sh step `sweep`) runs all 20 with
the same check and writes its JSON."""

import pytest
import torch

from tests.oracle import build_oracle
from tests.sweep_configs import sweep_configs
from tests.sweep_gates import check_replies

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
SPECS = sweep_configs(20)


@pytest.mark.parametrize("index", [0, 3, 5, 7])
def test_replies_agree_on_every_shape(tmp_path, index):
    spec = SPECS[index]
    folder = build_oracle(tmp_path, spec, seed=index)
    seen = check_replies(folder, "cuda", spec["vocab_size"])
    assert seen["errors"] == 0, seen
    assert seen["differ"] == 0, seen
    assert seen["compared"] > 0 and seen["cached_tokens"] > 0

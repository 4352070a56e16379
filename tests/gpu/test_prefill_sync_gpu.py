"""A prefill's forward never makes the host wait for the GPU: with torch's sync debug mode
set to raise, a round of prompt pieces (one chunked piece; short and long pieces together)
runs through every layer. A wait per layer (61511d3: the GDN states indexed by a host list,
a pageable copy and a stream sync) left the GPU idle for a quarter of a 2k prefill on the
H100 while the host caught up."""

import pytest
import torch

from flashlane.kernels.gpu import TRITON
from flashlane.models.layers.gated_deltanet import SHORT_PROMPT
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("lengths", [[SHORT_PROMPT + 36], [5, SHORT_PROMPT + 36, 9]], ids=str)
@torch.no_grad()
def test_prompt_pieces_run_without_a_host_wait(lengths):
    cfg, model = build_random(preset("flashnext-tiny"), torch.bfloat16, "cuda", 0)
    model.use_kernels(TRITON)
    g = torch.Generator().manual_seed(3)

    def rows() -> Rows:
        sessions = [SessionState.empty(cfg, 256, torch.bfloat16, torch.float32, "cuda")
                    for _ in lengths]  # fmt: skip
        ids = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
        return Rows.of([(s, t, 0, False, True) for s, t in zip(sessions, ids)], "cuda")

    model.residual(rows())  # compiles, fla's tuning: waits of their own, once a process
    torch.cuda.synchronize()
    ready = rows()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.residual(ready)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()

"""The plan counts each session's row of the lone driver's keyed-draw buffers on a GPU
(sampling/vocab_rows.py: one set for every size of step, made while serving), and the plan's
bytes an id agree with the buffers'."""

from __future__ import annotations

import torch

from flashlane.planning.buffers import DRAW_BYTES_PER_ID, DRAW_BYTES_PER_ROW, draw_row_bytes
from flashlane.planning.memory import GIB, plan, session_bytes
from flashlane.sampling.vocab_rows import BIAS_IDS, BYTES_PER_ID, BYTES_PER_ROW, SHAPES, VocabRows
from tests.planning.test_memory import TINY


def test_the_plan_and_the_buffers_agree_on_bytes_an_id():
    assert (DRAW_BYTES_PER_ID, DRAW_BYTES_PER_ROW) == (BYTES_PER_ID, BYTES_PER_ROW)
    pool = VocabRows(3, 10, torch.device("cpu"))
    for name, (_, width) in SHAPES.items():
        assert pool.take(name, 2).shape == (2, width or 10)
    assert pool.take("bias_ids", 1).shape == (1, BIAS_IDS)
    assert pool.nbytes() == 3 * (10 * DRAW_BYTES_PER_ID + DRAW_BYTES_PER_ROW)


def test_a_gpu_session_counts_its_draw_row_and_a_cpu_one_does_not():
    row = TINY.vocab_size * DRAW_BYTES_PER_ID + DRAW_BYTES_PER_ROW
    assert draw_row_bytes(TINY, "cuda") == row and draw_row_bytes(TINY, "cpu") == 0
    gpu = plan(TINY, device="cuda", limit_bytes=4 * GIB, weight_bytes=0, max_rows=16, parallel=3)
    assert gpu.session_bytes == (session_bytes(TINY, 512, 2, 4) + row,) * 3
    cpu = plan(TINY, device="cpu", limit_bytes=4 * GIB, weight_bytes=0, max_rows=16, parallel=3)
    assert cpu.session_bytes == (session_bytes(TINY, 512, 8, 8),) * 3


def test_a_larger_size_than_the_pool_was_made_for_gets_its_own_buffer():
    """Only an eager driver asks past its largest size; the older views keep their memory."""
    pool = VocabRows(2, 10, torch.device("cpu"))
    small = pool.take("counts", 2)
    small[1, 3] = 7
    big = pool.take("counts", 5)
    assert big.shape == (5, 10) and small[1, 3] == 7 and big.data_ptr() != small.data_ptr()
    assert pool.take("counts", 1).data_ptr() == big.data_ptr()


def test_info_says_what_a_gpu_session_holds_for_its_draws():
    from flashlane.planning.info import describe

    gpu = plan(TINY, device="cuda", limit_bytes=4 * GIB, weight_bytes=0, max_rows=16, parallel=2)
    assert gpu.draw_row_bytes == draw_row_bytes(TINY, "cuda")
    row = f"(each {gpu.draw_row_bytes / 2**20:.2f} MiB of sampled steps' buffers)"
    assert row in describe(TINY, gpu)
    cpu = plan(TINY, device="cpu", limit_bytes=4 * GIB, weight_bytes=0, max_rows=16, parallel=2)
    assert cpu.draw_row_bytes == 0 and "sampled steps' buffers" not in describe(TINY, cpu)

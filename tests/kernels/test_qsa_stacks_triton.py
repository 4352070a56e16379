"""tests/models/test_qsa_stacks.py through the Triton kernels: the blocks that stacked pieces
complete, pooled in one block_keys launch, equal each piece's alone, bit for bit (a program
a block, no dot)."""

import pytest

from tests.kernels.triton_env import DEVICE, needs_triton
from tests.models.test_qsa_stacks import stacked_blocks_equal_alone

pytestmark = needs_triton


@pytest.mark.parametrize("recurrent", [False, True], ids=["prompt pieces", "verify windows"])
def test_triton_blocks_pooled_together_equal_each_piece_alone(recurrent):
    from flashlane.kernels.gpu import TRITON

    stacked_blocks_equal_alone(TRITON, DEVICE, recurrent)

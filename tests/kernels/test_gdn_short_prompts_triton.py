"""tests/models/test_gdn_short_prompts.py through the Triton kernels, where short whole
prompts run the recurrent rule together: each piece's rows, conv inputs and final state
equal its piece's alone, bit for bit (the conv, heads and rule have a program a session and
no dot, so the interpreter's bits are the GPU's claim too)."""

import pytest

from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton
from tests.models.test_gdn_short_prompts import ALL_SHORT, LENGTHS, short_prompts_equal_alone

pytestmark = needs_triton


@pytest.mark.parametrize("lengths", [LENGTHS, ALL_SHORT])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_short_prompts_together_equal_each_alone(dtype, lengths):
    from flashlane.kernels.gpu import TRITON

    short_prompts_equal_alone(TRITON, DEVICE, dtype, lengths=lengths)

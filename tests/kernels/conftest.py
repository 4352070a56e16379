import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# FLASHLANE_SHUFFLED_DOT=1: the interpreter's tl.dot sums in orders set by the tile, to find
# bit-equality claims that hold only on some BLAS (tests/kernels/shuffled_dot.py)
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("FLASHLANE_SHUFFLED_DOT") == "1":
    from tests.kernels.shuffled_dot import install

    install()

# the interpreter patches triton.language once per launch, not at every nested helper call
# (tests/kernels/nested_calls.py: the same results, a third less time)
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.kernels.nested_calls import install as patch_once

    patch_once()


@pytest.fixture
def exact_e4m3(monkeypatch):
    """Under the interpreter, its fp32 -> e4m3 cast made the GPU's (`cvt.rn.satfinite`: round
    to nearest even; torch's cast, the kernels clamping to +-448 first). The interpreter's own
    truncates and rounds without a carry (-125.5 gives -64), so a kernel that makes e4m3 codes
    is tested on the CPU only under this. On the GPU: nothing."""
    if not INTERPRET:
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    plain = interpreter._convert_float

    def convert(x, src, dst, rounding):
        if src == tl.float32 and dst == tl.float8e4nv:
            t = torch.from_numpy(np.ascontiguousarray(x).view(np.float32).copy())
            return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return plain(x, src, dst, rounding)

    monkeypatch.setattr(interpreter, "_convert_float", convert)

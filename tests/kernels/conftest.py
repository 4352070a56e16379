import os

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

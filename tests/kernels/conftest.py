import os

# FLASHLANE_SHUFFLED_DOT=1: the interpreter's tl.dot sums in orders set by the tile, to find
# bit-equality claims that hold only on some BLAS (tests/kernels/shuffled_dot.py)
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("FLASHLANE_SHUFFLED_DOT") == "1":
    from tests.kernels.shuffled_dot import install

    install()

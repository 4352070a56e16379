"""Where the Triton kernel tests run: on a CUDA GPU (bf16 and fp32), or on the CPU through
Triton's interpreter (`TRITON_INTERPRET=1`, fp32 only: the interpreter has no bf16). Without
either they skip.

    TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels     # CPU, small shapes
    python -m pytest -m "triton or cuda" tests/kernels               # GPU
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_TRITON = importlib.util.find_spec("triton") is not None
RUNS = HAS_TRITON and (HAS_CUDA or INTERPRET)
DEVICE = "cuda" if HAS_CUDA else "cpu"
# the interpreter computes bf16 wrongly; it checks the kernels' indexing and arithmetic in fp32
DTYPES = [torch.float32, torch.bfloat16] if HAS_CUDA else [torch.float32]

needs_triton = [
    pytest.mark.triton,
    pytest.mark.cuda,
    pytest.mark.skipif(not RUNS, reason="needs Triton with a GPU or TRITON_INTERPRET=1"),
]

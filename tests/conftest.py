import gc
import os

import pytest
import torch

from tests.oracle import OTHER, TINY, build_oracle

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    return build_oracle(tmp_path_factory.mktemp("tiny"), TINY, seed=0)


@pytest.fixture(scope="session")
def other_ckpt(tmp_path_factory):
    return build_oracle(tmp_path_factory.mktemp("other"), OTHER, seed=3)


@pytest.fixture(scope="session", params=["tiny", "other"])
def oracle_ckpt(request, tiny_ckpt, other_ckpt):
    return tiny_ckpt if request.param == "tiny" else other_ckpt


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    # Triton kernel tests also run on the CPU through Triton's interpreter; their own
    # skip marker (tests/kernels/triton_env.py) decides
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if "cuda" in item.keywords and not (interpret and "triton" in item.keywords):
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _free_gpu_memory_after_module():
    """On a GPU, what a module's tests and fixtures built (models, CUDA graphs and their
    pools, engines in reference cycles) is collected and returned to the device before the
    next module, so that tests/gpu runs in one process (it held 101 GiB by test_pdl_gpu)."""
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _free_gpu_memory_after_test():
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()

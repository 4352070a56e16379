import gc
import os

import pytest
import torch

from tests.oracle import OTHER, SIBLINGS, TINY, build_oracle

torch.set_num_threads(2)


# name -> (config spec, seed) of every tiny oracle checkpoint
ORACLES = {"tiny": (TINY, 0), "other": (OTHER, 3), **{k: (v, 5) for k, v in SIBLINGS.items()}}


@pytest.fixture(scope="session")
def oracle_by_name(tmp_path_factory):
    """name -> its checkpoint folder, each built once a session (on first use)."""
    built = {}

    def get(name: str):
        if name not in built:
            spec, seed = ORACLES[name]
            built[name] = build_oracle(tmp_path_factory.mktemp(name), spec, seed=seed)
        return built[name]

    return get


@pytest.fixture(scope="session")
def tiny_ckpt(oracle_by_name):
    return oracle_by_name("tiny")


@pytest.fixture(scope="session")
def other_ckpt(oracle_by_name):
    return oracle_by_name("other")


@pytest.fixture(scope="session", params=["tiny", "other"])
def oracle_ckpt(request, tiny_ckpt, other_ckpt):
    return tiny_ckpt if request.param == "tiny" else other_ckpt


@pytest.fixture(scope="session", params=sorted(SIBLINGS))
def sibling_ckpt(request, oracle_by_name):
    """A tiny random checkpoint of each sibling family (qwen3_next, qwen3_5, qwen3_5_moe),
    with a random MTP head."""
    return oracle_by_name(request.param)


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

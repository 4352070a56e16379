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
    # Triton tests (marked cuda and triton) also run on the CPU under Triton's interpreter.
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if "cuda" in item.keywords and not (interpret and "triton" in item.keywords):
            item.add_marker(skip)

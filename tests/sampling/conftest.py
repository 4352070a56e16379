import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The draws are single-row numpy work; torch threads only add contention.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""models/segments.py: the weights' build switches expandable segments on and back off on
CUDA only, and never where the user set the option (checked with a stand-in setter)."""

import pytest

from flashlane.models import segments


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(segments, "_setter", lambda: seen.append)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    return seen


def test_on_within_and_off_after_on_cuda(calls):
    with segments.expandable_segments("cuda:0"):
        assert calls == ["expandable_segments:True"]
    assert calls == ["expandable_segments:True", "expandable_segments:False"]


def test_off_after_an_error(calls):
    with pytest.raises(RuntimeError), segments.expandable_segments("cuda"):
        raise RuntimeError("out of memory")
    assert calls[-1] == "expandable_segments:False"


def test_nothing_on_the_cpu_or_where_the_user_chose(calls, monkeypatch):
    with segments.expandable_segments("cpu"):
        pass
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    with segments.expandable_segments("cuda"):
        pass
    assert calls == []

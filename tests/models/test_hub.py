"""Hub ids: `--model org/name` that is not a folder is fetched with huggingface_hub from
HF_ENDPOINT (a fake hub on 127.0.0.1 here) into the cache, and read from the cache alone
when offline."""

from __future__ import annotations

import pytest

from flashlane.models.hub import ModelNotFound, resolve_model
from tests.models.fake_hub import FakeHub


@pytest.fixture
def hub(tiny_ckpt, tmp_path, monkeypatch):
    server = FakeHub({"acme/tiny-flash": tiny_ckpt})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)  # "acme/tiny-flash" is no folder here
    yield server
    server.stop()


def test_hub_id_is_fetched_into_the_cache_then_read_offline(hub, tiny_ckpt, tmp_path, monkeypatch):
    folder, name = resolve_model("acme/tiny-flash")
    assert name == "acme/tiny-flash"
    assert folder.is_relative_to(tmp_path / "cache")
    for f in ("config.json", "model.safetensors"):
        assert (folder / f).read_bytes() == (tiny_ckpt / f).read_bytes()
    assert any(r.startswith("GET /acme/tiny-flash/resolve/") for r in hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen = len(hub.requests)
    assert resolve_model("acme/tiny-flash")[0] == folder
    assert len(hub.requests) == seen  # offline: the cache alone


def test_offline_without_the_cache_says_so(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="HF_HUB_OFFLINE is set and it is not in the cache"):
        resolve_model("acme/tiny-flash")
    assert hub.requests == []


def test_unknown_repo_and_not_a_hub_id(hub):
    with pytest.raises(ModelNotFound, match="no such model on the hub"):
        resolve_model("acme/missing")
    with pytest.raises(ModelNotFound, match="no such folder"):
        resolve_model("./not/here/either")


def test_llm_loads_a_hub_id(hub):
    from flashlane.lanes.records import CostTable
    from flashlane.llm import LLM
    from flashlane.request import SamplingParams

    llm = LLM(
        "acme/tiny-flash",
        costs=CostTable({1: 1.0}, draft_step_ms=0.1, overhead_ms=0.1),
        parallel=1,
        max_rows=4,
    )
    out = llm.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0))[0]
    assert len(out.token_ids) == 3 and llm.engine.name == "acme/tiny-flash"

"""The prompt cache's bookkeeping: marks, longest-prefix lookup, budget and eviction order."""

import pytest

from flashlane.sessions.prompt_cache import PromptCache, prompt_marks


def test_marks_sit_on_the_chunk_grid_below_the_prompt_end():
    assert prompt_marks(300) == (256,)
    assert prompt_marks(257) == (256,)
    assert prompt_marks(256) == (192,)  # x = L - 1 = 255: the last token always re-runs
    assert prompt_marks(64) == ()
    assert prompt_marks(65) == (64,)
    assert prompt_marks(300, boundaries=[10, 70, 200, 300]) == (64, 192, 256)
    assert prompt_marks(9000, every=4096) == (4096, 8192, 8960)
    with pytest.raises(ValueError):
        prompt_marks(100, every=100)


def test_lookup_takes_the_longest_kept_strict_prefix_and_verifies_ids():
    cache = PromptCache(10_000)
    prompt = list(range(300))
    for n in (64, 192):
        cache.add(cache.reserve_id(), prompt[:n], 100, has_drafts=True)
    cache.add(cache.reserve_id(), prompt[:256], 100, has_drafts=False)
    assert cache.lookup(prompt, need_drafts=False).length == 256
    assert cache.lookup(prompt, need_drafts=True).length == 192  # 256 kept no MTP state
    assert cache.lookup(prompt[:192], need_drafts=False).length == 64  # strict prefix only
    other = [1, *prompt[1:]]
    assert cache.lookup(other, need_drafts=False) is None
    assert (cache.num_queries, cache.num_hits, cache.num_hit_tokens) == (4, 3, 512)


def test_adding_a_kept_prefix_again_replaces_it():
    cache = PromptCache(10_000)
    cache.add(cache.reserve_id(), range(64), 100, has_drafts=False)
    cache.add(cache.reserve_id(), range(64), 120, has_drafts=True)
    assert len(cache.entries) == 1 and cache.num_bytes == 120


def test_eviction_prefers_entries_never_resumed_then_least_recent():
    cache = PromptCache(300)
    a = cache.add(cache.reserve_id(), [1] * 64, 100, False)
    b = cache.add(cache.reserve_id(), [2] * 64, 100, False)
    c = cache.add(cache.reserve_id(), [3] * 64, 100, False)
    assert cache.lookup([1] * 65, False) is a  # a was resumed: evicted last
    assert cache.make_room(100) == [b.entry_id]
    d = cache.add(cache.reserve_id(), [4] * 64, 100, False)
    assert cache.make_room(150) == [c.entry_id, d.entry_id]
    assert cache.make_room(301) is None  # never fits: nothing evicted
    assert list(cache.entries) == [a.entry_id] and cache.num_bytes == 100


def test_a_zero_budget_disables_the_cache():
    cache = PromptCache(0)
    assert not cache.is_enabled
    assert cache.make_room(1) is None

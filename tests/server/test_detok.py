"""IncrementalDetokenizer never emits half a character; StopMatcher holds back and cuts."""

from __future__ import annotations

from flashlane.detok import IncrementalDetokenizer, StopMatcher

TEXT = "naïve café: ß 日本 😀 done"


def test_detokenizer_matches_decode_and_never_splits_a_character(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == TEXT == detok.text
    assert all("\ufffd" not in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens held bytes of a later character


def test_detokenizer_in_uneven_chunks(tokenizer):
    ids = tokenizer.encode(TEXT * 3, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    out, i, step = [], 0, 1
    while i < len(ids):
        out.append(detok.add(ids[i : i + step]))
        i, step = i + step, step % 4 + 1
    assert "".join(out) + detok.flush() == TEXT * 3


def test_detokenizer_flushes_incomplete_bytes_as_replacement(tokenizer):
    ids = tokenizer.encode("😀", add_special_tokens=False).ids
    byte_ids = tokenizer.encode("日", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids) == "😀"
    if len(byte_ids) > 1:
        assert detok.add(byte_ids[:1]) == ""
        assert detok.flush() == "\ufffd"


def test_detokenizer_skips_special_tokens_but_keeps_tags(tokenizer):
    ids = tokenizer.encode("<think>x</think><|im_end|>", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.add([i]) for i in ids) == "<think>x</think>"


def grow(matcher: StopMatcher, text: str, step: int = 1):
    """Feeds text a few characters at a time; returns (visible texts, last check)."""
    seen, check = [], None
    for end in range(step, len(text) + step, step):
        check = matcher.check(text[:end])
        seen.append(text[: check.visible])
        if check.stop:
            break
    return seen, check


def test_stop_matcher_holds_back_a_possible_start_and_cuts_at_the_stop():
    seen, check = grow(StopMatcher(["STOP here", "xyz"]), "say STOP now, then STOP here again")
    assert check.stop == "STOP here"
    assert seen[-1] == "say STOP now, then "
    assert all("STOP h" not in s for s in seen)
    # "STOP" was held back while it could still become "STOP here", then released
    assert "say " in seen and "say STOP now" in seen[-2]


def test_stop_matcher_earliest_stop_wins_and_no_stops_shows_everything():
    _, check = grow(StopMatcher(["cd", "bcde"]), "abcdef", step=6)
    assert check == (1, "bcde")  # "bcde" starts before "cd"
    assert StopMatcher(None).check("anything") == (8, None)
    assert StopMatcher("").check("abc") == (3, None)


def test_stop_matcher_a_stop_spanning_steps():
    matcher = StopMatcher(["</end>"])
    assert matcher.check("abc</") == (3, None)
    assert matcher.check("abc</en") == (3, None)
    assert matcher.check("abc</end>tail") == (3, "</end>")

"""body.decode_json: the same values as json.loads on both of its paths (the C scanner with
hooks, and the windowed Python scanner for large bodies), and the refusals."""

from __future__ import annotations

import json

import pytest

from flashlane.server import body
from flashlane.server.body import decode_json
from flashlane.server.protocol import ApiError

STRINGS = [
    "",
    "plain",
    'quote " and backslash \\',
    "\n\t\r\b\f/ controls",
    "é漢字😀",
    "x" * 200_000 + "\n" + "y" * 70_000,
]
VALUES = [
    {"s": STRINGS, "n": [0, -1, 2**62, 1.5, -2.5e-8, True, False, None], "o": {"a": {"b": []}}},
    [{"role": "user", "content": s} for s in STRINGS],
]


@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("large", [False, True])
def test_decodes_as_json_does(monkeypatch, ascii_only, large):
    if large:  # every body takes the windowed Python scanner
        monkeypatch.setattr(body, "_LARGE", 0)
    for value in VALUES:
        raw = json.dumps(value, ensure_ascii=ascii_only).encode()
        assert decode_json(raw) == json.loads(raw)
    pair = b'"\\ud83d\\ude00 and \\u00e9"'
    assert decode_json(pair) == json.loads(pair) == "\U0001f600 and \u00e9"


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100 + b"]" * 100,  # deeper than MAX_DEPTH
        b"[" * 10000 + b"]" * 10000,  # deeper than the interpreter's recursion limit
        b'"\\udfff"',
        b'{"\\ud800": 1}',
        b'["a\\ud83d"]',
        b"NaN",
        b'{"x": Infinity}',
        b"1" * 100,
        b'"unterminated',
        b'"bad \\x escape"',
        b'"raw \x01 control"',
        b"\xff\xfe",
    ],
)
def test_refuses_with_a_400(monkeypatch, raw, large):
    if large:
        monkeypatch.setattr(body, "_LARGE", 0)
    with pytest.raises(ApiError) as err:
        decode_json(raw)
    assert err.value.status == 400

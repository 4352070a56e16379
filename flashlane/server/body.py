"""Request bodies decoded off the event loop, without holding the GIL for long.

A body is read on the event loop (I/O only) and decoded here, on a worker thread. A worker
thread only helps if it gives the GIL back often: one C call that runs for a second stalls
every stream for that second. So the JSON decoder calls a Python hook per object and per
number (each call lets the GIL switch); a body over 4 MiB, or of very many strings, is decoded
by the pure Python scanner with strings scanned 64k characters at a time; messages are
validated one at a time; and a body with more values than any request that fits the context
needs is refused before it is decoded (parse_body). A 20 MB chat body then holds the GIL for
at most ~40 ms at a time (tests/server/test_stall.py measures the stall it causes).

Refused here, as 400s: invalid UTF-8 or JSON, NaN and Infinity, nesting deeper than
MAX_DEPTH, lone surrogates (which no tokenizer and no UTF-8 response can carry), and more
values than MAX_VALUES.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from flashlane.server.protocol import ApiError, ChatMessage, param_path, parse_request

M = TypeVar("M", bound=BaseModel)

MAX_DEPTH = 64  # OpenAI bodies nest a few levels; JSON schemas of tools a dozen
MAX_VALUES = 2_000_000  # JSON values in one body (a 32 MiB body of small ones holds ~5M)
MAX_PROMPTS = 256  # prompts in one /v1/completions batch (the default --max-queue)
# Past this many strings the C scanner would hold the GIL for over ~50 ms in one call.
_MANY_STRINGS = 100_000
_SLICE = 1 << 20  # bytes scanned per C call when counting or searching a body
# Past this size a body may hold a string whose one C call (scanstring) takes over ~15 ms.
_LARGE = 4 << 20
_WINDOW = 1 << 16  # characters of a string scanned per C call by _scan_string
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def decode_json(body: bytes) -> Any:
    """The body as JSON; 400 (`invalid_json`) for anything that is not strict, sane JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _invalid(f"the request body is not UTF-8: {e}") from None
    decoder = json.JSONDecoder(
        object_pairs_hook=_object,
        parse_int=_int,
        parse_float=_float,
        parse_constant=_constant,
    )
    if len(body) > _LARGE or (len(body) > _SLICE and _count(body, b'"') > 2 * _MANY_STRINGS):
        # the Python scanner, with strings scanned a window at a time: slower, but every C
        # call it makes is short
        decoder.parse_string = _scan_string  # type: ignore[assignment]
        decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        value = decoder.decode(text)
    except RecursionError:
        raise _invalid(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError and the constants refused
        raise _invalid(f"the request body is not valid JSON: {e}") from None
    _check_shape(value, surrogates=_has(body, _SURROGATE_ESCAPE))
    return value


def parse_body(body: bytes, model: type[M], max_model_len: int) -> M:
    """A request body as `model`, on a prep thread: its values counted against the context,
    decoded, lists capped by the context, messages validated one by one, then the whole."""
    # Decoding millions of values costs seconds of a prep thread, and the collector's passes
    # over them stall every thread; no request that fits the context needs that many.
    most = 16 * max_model_len + 2**17
    if len(body) > most and _count(body, b",") > most:
        msg = f"the request holds more than {most} values, more than any that fits the context"
        raise ApiError(400, msg, code="context_length_exceeded")
    data = decode_json(body)
    if isinstance(data, dict):
        cap_lists(data, max_model_len)
        if "messages" in model.model_fields:
            validate_items(data, "messages", ChatMessage)
    return parse_request(model, data)


def validate_items(data: dict[str, Any], key: str, model: type[M]) -> None:
    """Validates the list `data[key]` one item at a time (each a short C call, so the GIL
    switches between them) and puts the models in its place; the request's own validation
    then takes them as they are. A non-list is left for that validation to refuse."""
    items = data.get(key)
    if not isinstance(items, list):
        return
    out: list[Any] = []
    for i, item in enumerate(items):
        try:
            out.append(model.model_validate(item))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            param = param_path((key, i, *err["loc"]))
            raise ApiError(400, f"{param}: {err['msg']}", param=param) from None
    data[key] = out


def cap_lists(data: dict[str, Any], max_model_len: int) -> None:
    """Lists that cannot fit the context, refused before they are validated (validating a
    list is one long C call): more messages or prompt token ids than the context holds (each
    takes a token at least), or a batch of more than MAX_PROMPTS prompts."""
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > max_model_len:
        msg = f"{len(messages)} messages cannot fit a context of {max_model_len} tokens"
        raise ApiError(400, msg, param="messages", code="context_length_exceeded")
    prompt = data.get("prompt")
    tokens = data.get("tokens")
    if isinstance(tokens, list) and len(tokens) > max_model_len:
        msg = f"more token ids than the context's {max_model_len}"
        raise ApiError(400, msg, param="tokens", code="context_length_exceeded")
    if not isinstance(prompt, list) or not prompt:
        return
    if isinstance(prompt[0], int):
        id_lists = [prompt]
    else:
        if len(prompt) > MAX_PROMPTS:
            msg = f"a batch holds at most {MAX_PROMPTS} prompts; send more as several requests"
            raise ApiError(400, msg, param="prompt")
        id_lists = [p for p in prompt if isinstance(p, list)]
    if any(len(ids) > max_model_len for ids in id_lists):
        msg = f"a prompt of more token ids than the context's {max_model_len}"
        raise ApiError(400, msg, param="prompt", code="context_length_exceeded")


def _invalid(message: str) -> ApiError:
    return ApiError(400, message, code="invalid_json")


# Python-level hooks: the decoder calls them per value, and every call can drop the GIL.
def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)


def _int(digits: str) -> int:
    if len(digits) > 40:  # int() of a huge digit string is quadratic and never a valid field
        raise ValueError(f"the number {digits[:20]}... is too long")
    return int(digits)


def _float(text: str) -> float:
    return float(text)


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _scan_string(text: str, end: int, strict: bool = True) -> tuple[str, int]:
    """A JSON string whose opening quote ends at `end`: (its value, the index after its
    closing quote); as json's scanstring, but no regex runs over more than _WINDOW
    characters. An escaped surrogate pair is one character; a lone surrogate is kept, and
    refused after decoding (_check_shape)."""
    parts: list[str] = []
    pos = end
    while True:
        plain = _PLAIN.match(text, pos, min(pos + _WINDOW, len(text)))
        assert plain is not None  # the pattern matches the empty string
        parts.append(plain.group())
        pos = plain.end()
        if pos >= len(text):
            raise json.JSONDecodeError("Unterminated string", text, end - 1)
        char = text[pos]
        if char == '"':
            return "".join(parts), pos + 1
        if char == "\\":
            value, pos = _escape(text, pos)
            parts.append(value)
        elif char < " ":
            if strict:
                raise json.JSONDecodeError("Invalid control character", text, pos)
            parts.append(char)
            pos += 1
        # else the window ended inside plain text: go on from there


def _escape(text: str, pos: int) -> tuple[str, int]:
    """The escape at text[pos] (a backslash): its value, and the index after it."""
    kind = text[pos + 1 : pos + 2]
    if kind in _ESCAPED:
        return _ESCAPED[kind], pos + 2
    digits = text[pos + 2 : pos + 6]
    if kind != "u" or len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise json.JSONDecodeError("Invalid \\escape", text, pos)
    code = int(digits, 16)
    after = pos + 6
    # a high surrogate followed by an escaped low one is one character
    if 0xD800 <= code <= 0xDBFF and text[after : after + 2] == "\\u":
        low_digits = text[after + 2 : after + 6]
        if len(low_digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in low_digits):
            low = int(low_digits, 16)
            if 0xDC00 <= low <= 0xDFFF:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), after + 6
    return chr(code), after


def _check_shape(value: Any, surrogates: bool) -> None:
    """Depth, count and (when the body escapes any) lone surrogates, walked iteratively."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise _invalid(f"the request body holds more than {MAX_VALUES} values")
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise _invalid(f"the request body nests deeper than {MAX_DEPTH} levels")
            if surrogates:
                for key in item:
                    _check_text(key)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > MAX_DEPTH:
                raise _invalid(f"the request body nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in item)
        elif surrogates and isinstance(item, str):
            _check_text(item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"{text[max(0, e.start - 20) : e.start]!r}"
        raise ApiError(
            400,
            f"the request holds a lone surrogate ({text[e.start]!r} after {where}), which is "
            "not a character: escape pairs as \\ud83d\\ude00 or send UTF-8",
            code="invalid_unicode",
        ) from None


def _slices(body: bytes, overlap: int = 0) -> Iterator[bytes]:
    for start in range(0, len(body), _SLICE):
        yield body[start : start + _SLICE + overlap]


def _count(body: bytes, needle: bytes) -> int:
    return sum(part.count(needle) for part in _slices(body))


def _has(body: bytes, pattern: re.Pattern[bytes]) -> bool:
    return any(pattern.search(part) for part in _slices(body, overlap=8))

"""bench serve's client: one streamed completion, timed (`send`), as `Result`."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Result:
    """One request as the client saw it."""

    ok: bool = False
    text: str = ""
    token_ids: list[int] | None = None  # where the server returns them (return_token_ids)
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


async def send(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float = 600.0
) -> Result:
    """Streams one completion and times it; any failure, a stall past `timeout` seconds in
    all, or a stream cut before [DONE] comes back as the result's error."""
    try:
        return await asyncio.wait_for(_send(client, url, body), timeout)
    except asyncio.TimeoutError:
        return Result(error=f"no complete reply within {timeout:g} s")


@asynccontextmanager
async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]):
    """The completion's streamed response. A kept-alive connection the server has just closed
    fails before any answer (llama-server closes each after a few requests): that one failure
    is tried again, on a fresh connection. It shows as a disconnect, or as a reset when the
    server closed with the request unread (seen on a loaded 2-core machine)."""
    request = client.build_request("POST", f"{url}/v1/completions", json=body)
    try:
        response = await client.send(request, stream=True)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        response = await client.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Result:
    result = Result()
    start = last = time.perf_counter()
    finished = False
    try:
        async with _stream(client, url, body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    finished = True
                    continue
                if not line.startswith("data: "):
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    result.error = str(data["error"].get("message"))
                    return result
                if data.get("usage"):
                    result.output_tokens = data["usage"]["completion_tokens"]
                choices = data.get("choices", ())
                text = "".join(c.get("text") or "" for c in choices)
                ids = [t for c in choices for t in (c.get("token_ids") or ())]
                if any("token_ids" in c for c in choices):
                    result.token_ids = (result.token_ids or []) + ids
                if not text and not ids:  # a chunk of tokens the tokenizer does not show
                    continue
                now = time.perf_counter()
                if not result.ttft:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                result.text += text
    except (
        httpx.HTTPError,
        httpx.StreamError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
    ) as e:  # a dropped connection, a malformed chunk
        result.error = f"{type(e).__name__}: {e}"
        return result
    if not finished:
        result.error = "the stream ended before data: [DONE] (connection dropped?)"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result


def compared(r: Result) -> tuple:
    """What --check-alone compares: the token ids where the server returned them, else text."""
    return ("ids", tuple(r.token_ids)) if r.token_ids is not None else ("text", r.text)

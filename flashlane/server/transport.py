"""HTTP plumbing shared by the endpoints: bounded JSON bodies, SSE, and client disconnects."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from flashlane.server.body import decode_json
from flashlane.server.protocol import ApiError

T = TypeVar("T")

# nginx's spelling for "the client closed the connection before the response"
CLIENT_GONE = 499


class ClientGone(Exception):
    """The client disconnected while its request was being served."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, read on the event loop (decode it on a prep thread: body.py): 413
    past `limit` bytes, checked while reading; ClientGone if the client leaves meanwhile."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise ClientGone from None
    return bytes(body)


async def read_json(request: Request, limit: int) -> Any:
    """The body decoded as JSON (body.decode_json), on a worker thread. An endpoint that also
    renders or tokenizes does all of it on a prep thread instead (ServerState.offload)."""
    body = await read_body(request, limit)
    return await asyncio.to_thread(decode_json, body)


def _too_large(limit: int) -> ApiError:
    msg = f"the request body is larger than {limit} bytes"
    # the rest of the body is never read, so the connection cannot carry another request
    close = {"Connection": "close"}
    return ApiError(413, msg, code="request_too_large", headers=close)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


SSE_DONE = sse("[DONE]")

_log = logging.getLogger("flashlane.server")


async def guarded_events(events: AsyncIterator[str], stream_id: str) -> AsyncIterator[str]:
    """A reply's SSE events, then [DONE]; an error mid-stream becomes an OpenAI error event
    (the status line has gone out already)."""
    try:
        async for event in events:
            yield event
    except ApiError as e:
        yield sse(e.body())
    except Exception as e:
        _log.exception("stream %s failed", stream_id)
        yield sse(ApiError(500, f"internal error: {e!r}", type="server_error").body())
    yield SSE_DONE


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work` unless the client disconnects first (then cancels it, raises ClientGone).
    Call it after the body has been read: later messages are only the disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone
    finally:
        watcher.cancel()
        task.cancel()
        # a gather cancelled here may still end with a child's exception: retrieve it, or
        # asyncio logs "_GatheringFuture exception was never retrieved"
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(StreamingResponse):
    """An SSE response that always runs `on_close` when it ends: finished, or cancelled because
    the client went away (Starlette cancels the body while it waits to send)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()

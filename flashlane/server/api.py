"""The OpenAI-compatible HTTP app: routes, API keys, errors in OpenAI's shape, request logs.

app = build_app(engine)              # or build_app() now and attach_engine(app, engine)
                                     # when it has loaded: /health answers 503 until then
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flashlane import __version__
from flashlane.server.body import parse_body
from flashlane.server.chat import template_messages
from flashlane.server.chat_endpoint import chat_completions
from flashlane.server.completion_endpoint import completions
from flashlane.server.engine_api import EngineLike, EngineSlot
from flashlane.server.generate import check_token_ids
from flashlane.server.guard import Guard, GuardPolicy
from flashlane.server.messages_endpoint import messages
from flashlane.server.openapi import openapi_document
from flashlane.server.protocol import ApiError, DetokenizeRequest, TokenizeRequest
from flashlane.server.responses_endpoint import responses
from flashlane.server.state import ServerState
from flashlane.server.transport import (
    CLIENT_GONE,
    ClientGone,
    error_response,
    read_body,
    until_disconnect,
)

logger = logging.getLogger("flashlane.server")


def build_app(
    engine: EngineLike | None = None,
    *,
    api_keys: Iterable[str] = (),
    metrics_keys: Iterable[str] = (),
    allowed_hosts: frozenset[str] | None = None,
    allowed_origins: Iterable[str] = (),
    served_model_name: str | None = None,
    max_body_bytes: int = 32 * 2**20,
    request_timeout: float | None = None,
) -> FastAPI:
    """The app; with `engine=None` it serves /health (503) until `attach_engine`.
    `allowed_hosts`: the Host names answered (None: any; serve.py derives them from the bind
    address); `allowed_origins`: origins CORS lets read replies (none: no CORS headers)."""
    state = ServerState(
        slot=EngineSlot(),
        api_keys=tuple(k for k in api_keys if k),
        served_model_name=served_model_name,
        max_body_bytes=max_body_bytes,
        request_timeout=request_timeout,
    )
    app = FastAPI(title="flashlane", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.flashlane = state
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(HTTPException, _http_error)
    # added innermost first: the request log sees every answer, the guard runs after CORS
    # has answered a preflight
    policy = GuardPolicy(state.api_keys, tuple(k for k in metrics_keys if k), allowed_hosts)
    app.add_middleware(Guard, policy=policy)
    origins = [o for o in allowed_origins if o]
    if origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(_Errors)
    app.add_middleware(_RequestLog)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/models", _models, methods=["GET"])
    app.add_api_route("/v1/messages", messages, methods=["POST"])
    app.add_api_route("/v1/responses", responses, methods=["POST"])
    app.add_api_route("/v1/models/{model_id:path}", _model, methods=["GET"])
    app.add_api_route("/version", _version, methods=["GET"])
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route("/tokenize", _tokenize, methods=["POST"])
    app.add_api_route("/detokenize", _detokenize, methods=["POST"])
    document = openapi_document()
    app.add_api_route("/openapi.json", lambda: JSONResponse(document), methods=["GET"])
    if engine is not None:
        attach_engine(app, engine)
    return app


def attach_engine(app: FastAPI, engine: EngineLike) -> None:
    """Publishes a loaded engine; safe to call from the loading thread."""
    app.state.flashlane.attach(engine)


def engine_failed(app: FastAPI, message: str) -> None:
    """Records a failed load: /health and every request answer 503 with `message`."""
    app.state.flashlane.slot.fail(message)


def start_draining(app: FastAPI) -> None:
    """Stops admitting requests (503); streams already running go on."""
    app.state.flashlane.slot.draining = True


def cancel_replies(app: FastAPI) -> None:
    """Aborts every reply in flight (the end of a drain); call it on the app's event loop."""
    app.state.flashlane.cancel_live()


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_GONE, headers={"Connection": "close"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    # a 405 keeps Starlette's Allow header
    error = ApiError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers)
    return error_response(error)


def _card(state: ServerState) -> dict[str, Any]:
    engine = state.engine()
    return {
        "id": state.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "flashlane",
        "root": engine.model_name,
        "max_model_len": engine.context_len,
    }


async def _models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_card(request.app.state.flashlane)]})


async def _model(request: Request) -> Response:
    """GET /v1/models/{id}: the card of the model served under that id, else 404."""
    state: ServerState = request.app.state.flashlane
    card = _card(state)
    state.check_model(request.path_params["model_id"] or "-")
    return JSONResponse(card)


async def _version(request: Request) -> Response:
    return JSONResponse({"version": __version__})


async def _health(request: Request) -> Response:
    slot = request.app.state.flashlane.slot
    error = getattr(slot.engine, "error", None) or slot.failed
    if error:
        return JSONResponse({"status": "failed", "error": error}, status_code=503)
    if slot.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if slot.engine is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> Response:
    metrics = request.app.state.flashlane.metrics
    body = metrics.render() if metrics is not None else b""
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    engine = state.engine()
    body = await read_body(request, state.max_body_bytes)
    ids = await until_disconnect(request, state.offload(_tokenize_body, state, engine, body))
    return JSONResponse({"count": len(ids), "max_model_len": engine.context_len, "tokens": ids})


def _tokenize_body(state: ServerState, engine: EngineLike, body: bytes) -> list[int]:
    req = parse_body(body, TokenizeRequest, engine.context_len)
    if req.messages is None:
        assert req.text is not None
        return state.encode(req.text, special=req.add_special_tokens, param="prompt")
    text = state.chat_template().render(
        template_messages(req.messages),
        tools=[t.model_dump(exclude_none=True) for t in req.tools or ()],
        add_generation_prompt=req.add_generation_prompt,
        template_kwargs=state.template_kwargs(req.chat_template_kwargs),
    )
    return state.encode(text, special=False, param="messages")


async def _detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    engine = state.engine()  # 503 while loading
    body = await read_body(request, state.max_body_bytes)
    text = await until_disconnect(request, state.offload(_detokenize_body, state, engine, body))
    return JSONResponse({"prompt": text})


def _detokenize_body(state: ServerState, engine: EngineLike, body: bytes) -> str:
    req = parse_body(body, DetokenizeRequest, engine.context_len)
    check_token_ids(req.tokens, state.vocab_size, "tokens")
    return state.decode(req.tokens)


class _Errors:
    """Turns an exception no handler took into a 500 in OpenAI's shape, and does not re-raise
    it: Starlette's own handler re-raises, and the server then drops the keep-alive
    connection without a word. A client that left mid-request is no error (499)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except (ClientDisconnect, ClientGone):
            if not started:
                await Response(status_code=CLIENT_GONE)(scope, receive, send)
        except Exception as exc:
            logger.exception("internal error on %s", scope["path"])
            if not started:  # else the stream's own error event has gone out (guarded_events)
                error = ApiError(500, f"internal error: {exc!r}", type="server_error")
                await error_response(error)(scope, receive, send)


class _RequestLog:
    """One log line per request (method, path, status, time, its X-Request-Id and the reply's
    id), the flashlane_http_requests counter, and X-Request-Id on every response: the
    client's own, else a fresh one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        rid = _request_id(scope)

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0] != _REQUEST_ID]
                message = {**message, "headers": [*headers, (_REQUEST_ID, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._log(scope, status, time.perf_counter() - start, rid)

    def _log(self, scope: Scope, status: int, seconds: float, rid: str) -> None:
        path = scope["path"]
        state: ServerState = scope["app"].state.flashlane
        if state.metrics is not None:
            route = path if path in _ROUTES else "other"
            state.metrics.requests.labels(route, str(status)).inc()
        info = scope.get("state", {})
        runs = " ".join(run.summary() for run in info.get("runs", ()))
        reply = f" {info.get('reply_id', '')} {runs}" if runs else ""
        logger.info("%s %s %d %.3fs %s%s", scope["method"], path, status, seconds, rid, reply)


_REQUEST_ID = b"x-request-id"


def _request_id(scope: Scope) -> str:
    """The client's X-Request-Id (printable, at most 128 characters kept), else a new one."""
    for name, value in scope.get("headers", ()):
        if name == _REQUEST_ID:
            text = value.decode("latin-1").strip()[:128]
            if text and text.isprintable():
                return text
    return uuid.uuid4().hex


_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/models",
        "/health",
        "/metrics",
        "/tokenize",
        "/detokenize",
        "/version",
        "/openapi.json",
    }
)

"""The OpenAI-compatible HTTP app: routes, API keys, errors in OpenAI's shape, request logs.

app = build_app(engine)              # or build_app() now and attach_engine(app, engine)
                                     # when it has loaded: /health answers 503 until then
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flashlane import __version__
from flashlane.server.chat import template_messages
from flashlane.server.chat_endpoint import chat_completions
from flashlane.server.completion_endpoint import completions
from flashlane.server.engine_api import EngineLike, EngineSlot
from flashlane.server.generate import check_token_ids
from flashlane.server.messages_endpoint import messages
from flashlane.server.protocol import ApiError, DetokenizeRequest, TokenizeRequest, parse_request
from flashlane.server.responses_endpoint import responses
from flashlane.server.state import ServerState
from flashlane.server.transport import CLIENT_GONE, ClientGone, error_response, read_json

logger = logging.getLogger("flashlane.server")


def build_app(
    engine: EngineLike | None = None,
    *,
    api_keys: Iterable[str] = (),
    served_model_name: str | None = None,
    max_body_bytes: int = 32 * 2**20,
    request_timeout: float | None = None,
) -> FastAPI:
    """The app; with `engine=None` it serves /health (503) until `attach_engine`."""
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
    app.add_exception_handler(Exception, _server_error)
    app.add_middleware(_RequestLog)
    app.add_api_route("/v1/chat/completions", _keyed(chat_completions), methods=["POST"])
    app.add_api_route("/v1/completions", _keyed(completions), methods=["POST"])
    app.add_api_route("/v1/messages", _keyed(messages), methods=["POST"])
    app.add_api_route("/v1/responses", _keyed(responses), methods=["POST"])
    app.add_api_route("/v1/models", _keyed(_models), methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _keyed(_model), methods=["GET"])
    app.add_api_route("/version", _version, methods=["GET"])
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route("/tokenize", _tokenize, methods=["POST"])
    app.add_api_route("/detokenize", _detokenize, methods=["POST"])
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


def _keyed(endpoint: Any) -> Any:
    """Wraps a /v1 endpoint with the --api-key check (Bearer token)."""

    async def guarded(request: Request) -> Response:
        keys = request.app.state.flashlane.api_keys
        if keys:
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if not header and "x-api-key" in request.headers:  # the anthropic SDK's header
                scheme, token = "bearer", request.headers["x-api-key"]
            ok = scheme.lower() == "bearer" and any(
                hmac.compare_digest(token.strip().encode(), k.encode()) for k in keys
            )
            if not ok:
                raise ApiError(
                    401,
                    "missing or incorrect API key (Authorization: Bearer KEY)",
                    code="invalid_api_key",
                )
        return await endpoint(request)

    return guarded


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_GONE)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(exc.status_code, str(exc.detail), type=kind))


async def _server_error(request: Request, exc: Exception) -> Response:
    logger.exception("internal error on %s", request.url.path)
    return error_response(ApiError(500, f"internal error: {exc!r}", type="server_error"))


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
    if slot.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if slot.engine is None:
        body = {"status": "failed", "error": slot.failed} if slot.failed else {"status": "loading"}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> Response:
    metrics = request.app.state.flashlane.metrics
    body = metrics.render() if metrics is not None else b""
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    engine = state.engine()
    req = parse_request(TokenizeRequest, await read_json(request, state.max_body_bytes))
    if req.messages is not None:
        text = state.chat_template().render(
            template_messages(req.messages),
            tools=[t.model_dump(exclude_none=True) for t in req.tools or ()],
            add_generation_prompt=req.add_generation_prompt,
            template_kwargs=state.template_kwargs(req.chat_template_kwargs),
        )
        ids = state.encode(text, special=False, param="messages")
    else:
        assert req.text is not None
        ids = state.encode(req.text, special=req.add_special_tokens, param="prompt")
    return JSONResponse({"count": len(ids), "max_model_len": engine.context_len, "tokens": ids})


async def _detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    state.engine()  # 503 while loading
    req = parse_request(DetokenizeRequest, await read_json(request, state.max_body_bytes))
    check_token_ids(req.tokens, state.vocab_size, "tokens")
    return JSONResponse({"prompt": state.decode(req.tokens)})


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
    }
)

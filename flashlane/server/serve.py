"""`flashlane serve`: uvicorn around build_app, the engine loaded beside it, SIGTERM drains.

The HTTP port opens at once (/health answers 503 "loading") while the engine loads on a worker
thread. SIGTERM or SIGINT: new requests get 503, live streams get --drain-timeout seconds to
finish and are then cancelled (their engine requests aborted), the engine is closed, and the
process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from flashlane.server.api import (
    attach_engine,
    build_app,
    cancel_replies,
    engine_failed,
    start_draining,
)
from flashlane.server.engine_api import EngineLike
from flashlane.sessions.memory import OverMemoryLimit

logger = logging.getLogger("flashlane.server")

EngineFactory = Callable[[], EngineLike]


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """The HTTP flags of `flashlane serve` (the engine flags are cli.py's)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on "
                        "(default: 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="accepted Bearer key for /v1 routes, repeatable (default: none, no key needed)",
    )
    parser.add_argument(
        "--served-model-name", default=None,
        help="the model id clients send and /v1/models lists (default: the hub id or the "
        "folder's name)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
        help="(default: info)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds a request may take before it is aborted, 408 (default: no limit)",
    )
    parser.add_argument(
        "--max-body-mb", type=float, default=32.0,
        help="largest request body in MiB, 413 beyond (default: 32)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds live streams get to finish after SIGTERM (default: 30)",
    )


def serve_main(args: argparse.Namespace, make_engine: EngineFactory | None = None) -> None:
    """Serves until SIGTERM/SIGINT. `make_engine` builds the engine (on a worker thread);
    by default `flashlane.server.engine_thread.start_engine(args)`."""
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if make_engine is None:
        make_engine = _default_factory(args)
    app = build_app(
        api_keys=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=int(args.max_body_mb * 2**20),
        request_timeout=args.request_timeout,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,
        access_log=False,  # the app logs one line per request itself
        # a backstop: the drain itself aborts replies after --drain-timeout
        timeout_graceful_shutdown=args.drain_timeout + 5.0,
    )
    server = _DrainingServer(config, app, args.drain_timeout)
    loaded: list[EngineLike] = []
    loader = threading.Thread(
        target=_load, args=(make_engine, app, server, loaded), name="engine-load", daemon=True
    )
    # uvicorn re-raises the signal that stopped it once it is done: make that a no-op
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
    loader.start()
    server.run()
    for engine in loaded:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    if app.state.flashlane.slot.failed:
        raise SystemExit(1)


def _default_factory(args: argparse.Namespace) -> EngineFactory:
    def make() -> EngineLike:
        from flashlane.server.engine_thread import start_engine  # the engine is heavy: load late

        return start_engine(args)

    return make


def _load(
    make_engine: EngineFactory, app: object, server: uvicorn.Server, loaded: list[EngineLike]
) -> None:
    try:
        engine = make_engine()
    except BaseException as e:
        if isinstance(e, ValueError | OSError | OverMemoryLimit):  # its message says it all
            logger.error("the engine failed to load: %s", e)
        else:
            logger.exception("the engine failed to load")
        engine_failed(app, f"{type(e).__name__}: {e}")  # type: ignore[arg-type]
        server.should_exit = True
        return
    loaded.append(engine)
    attach_engine(app, engine)  # type: ignore[arg-type]
    logger.info("serving %s (context %d)", engine.model_name, engine.context_len)


def _ignore(sig: int, frame: FrameType | None) -> None:
    pass


class _DrainingServer(uvicorn.Server):
    """On a shutdown signal: stop admitting at once, abort what still runs after the drain
    timeout (so streams end with finish_reason "abort" and [DONE]), then let uvicorn close."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_timeout = drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            start_draining(self._app)
            if self._loop is not None:
                cancel = lambda: cancel_replies(self._app)  # noqa: E731
                self._loop.call_soon_threadsafe(self._loop.call_later, self._drain_timeout, cancel)
        super().handle_exit(sig, frame)

"""`flashlane serve`: uvicorn around build_app, the engine loaded beside it, SIGTERM drains.

The HTTP port opens at once (/health answers 503 "loading") while the engine loads on a worker
thread. SIGTERM or SIGINT: the port stays open and new requests get 503 "shutting_down", live
streams get --drain-timeout seconds to finish and are then cancelled (their engine requests
aborted, the streams ending with finish_reason "abort"), the engine is closed, and the process
exits 0. A second signal cancels the streams at once. An engine that fails (its thread raised)
has ended every request in flight with an error; /health answers 503 and the process exits 1,
so that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from flashlane.planning.memory import OverMemoryLimit
from flashlane.server.api import (
    attach_engine,
    build_app,
    cancel_replies,
    engine_failed,
    start_draining,
)
from flashlane.server.engine_api import EngineLike
from flashlane.server.flags import add_serve_flags
from flashlane.server.guard import allowed_hosts

logger = logging.getLogger("flashlane.server")

EngineFactory = Callable[[], EngineLike]
__all__ = ["add_serve_flags", "serve_main"]


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
        metrics_keys=args.metrics_key,
        allowed_hosts=allowed_hosts(args.host, args.allowed_hosts),
        allowed_origins=[o.strip() for item in args.allowed_origins for o in item.split(",")],
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
        # the drain has run before uvicorn shuts down: this only bounds the last writes
        timeout_graceful_shutdown=_LAST_WRITES,
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
    if app.state.flashlane.slot.failed:  # the load failed, or the engine later
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


_LAST_WRITES = 5.0  # seconds for the last events of cancelled streams to go out


class _DrainingServer(uvicorn.Server):
    """Keeps the port open while it drains: a shutdown signal stops admitting (503), and the
    server exits once no reply is live, or cancels what still runs after the drain timeout (or
    at a second signal) and exits when those have ended. It exits, too, when the engine has
    failed (serve_main then exits 1)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_timeout = drain_timeout
        self._deadline: float | None = None  # when live replies are cancelled
        self._cancelled_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._deadline is None:
            logger.info("draining: %d replies live", len(self._app.state.flashlane.live_runs))
            start_draining(self._app)
            self._deadline = now + self._drain_timeout
        else:
            logger.info("second signal: cancelling the live replies")
            self._deadline = min(self._deadline, now)

    async def on_tick(self, counter: int) -> bool:
        state = self._app.state.flashlane
        error = getattr(state.slot.engine, "error", None)
        if error and not state.slot.failed:
            logger.error("exiting: %s", error)
            engine_failed(self._app, error)
            self.should_exit = True
        if self._deadline is not None and not self.should_exit:
            now = time.monotonic()
            if not state.live_runs:
                self.should_exit = True
            elif self._cancelled_at is None and now >= self._deadline:
                cancel_replies(self._app)
                self._cancelled_at = now
            elif self._cancelled_at is not None and now >= self._cancelled_at + _LAST_WRITES:
                self.should_exit = True
        return await super().on_tick(counter)

"""The HTTP flags of `flashlane serve`, apart from the server so that they need no fastapi,
and the server's entry point loaded with a clear error where fastapi or uvicorn is missing."""

from __future__ import annotations

import argparse


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """The HTTP flags of `flashlane serve` (the engine flags are cli.py's)."""
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="accepted Bearer key for every route but /health and /metrics, repeatable "
        "(default: none, no key needed)",
    )
    parser.add_argument(
        "--metrics-key",
        action="append",
        default=[],
        help="Bearer key /metrics requires, repeatable (default: none, /metrics open)",
    )
    parser.add_argument(
        "--allowed-hosts",
        action="append",
        default=[],
        help="Host header values served, comma-separated ('*': any); default: the --host "
        "address (with localhost when it is loopback), any when bound to every interface",
    )
    parser.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        help="origins CORS lets read replies, comma-separated ('*': any); default: none",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send and /v1/models lists (default: the hub id or the "
        "folder's name)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="(default: info)",
    )
    parser.add_argument(
        "--log-stats-interval",
        type=float,
        default=10.0,
        help="seconds between the engine's stats lines (rounds, shared and lone time, "
        "prompt rows/s, out tok/s, streams; 0: none; default: 10)",
    )
    parser.add_argument(
        "--disable-log-stats",
        dest="log_stats_interval",
        action="store_const",
        const=0.0,
        help="vLLM's name for --log-stats-interval 0 (default: off, the lines logged)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds a request may take before it is aborted, 408 (default: no limit)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=32.0,
        help="largest request body in MiB, 413 beyond (default: 32)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds live streams get to finish after SIGTERM (default: 30)",
    )


def load_serve_main():
    """server.serve.serve_main, or a ValueError naming the package this Python lacks."""
    try:
        from flashlane.server.serve import serve_main
    except ImportError as err:
        raise ValueError(
            f"flashlane serve needs {err.name or err}, which this Python cannot import; "
            "reinstall flashlane (pip install flashlane) to get fastapi and uvicorn"
        ) from err
    return serve_main

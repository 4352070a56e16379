"""The gate every request passes before its route: the Host header, the API key, and a JSON
Content-Type on bodies.

Why each: a page in the user's browser can reach a server on loopback. A cross-origin POST
with a `text/plain` or form body needs no CORS preflight, so without the Content-Type check
any web page could make a keyless local server generate; a DNS-rebinding page talks to it
under its own host name, which the Host check refuses. Every route needs the key (when one is
set) except /health, which orchestrators probe, and /metrics, which has its own
(`--metrics-key`): a route added later is keyed without anyone remembering to.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from flashlane.server.protocol import ApiError
from flashlane.server.transport import error_response

OPEN_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    api_keys: tuple[str, ...] = ()  # Bearer keys for every route but OPEN_PATHS and /metrics
    metrics_keys: tuple[str, ...] = ()  # Bearer keys for /metrics; none: /metrics is open
    allowed_hosts: frozenset[str] | None = None  # Host names served; None: any

    def keys_for(self, path: str) -> tuple[str, ...]:
        if path in OPEN_PATHS:
            return ()
        return self.metrics_keys if path == METRICS_PATH else self.api_keys


def allowed_hosts(bind: str, given: Iterable[str] = ()) -> frozenset[str] | None:
    """The Host names a server bound to `bind` answers: `--allowed-hosts` when given ("*":
    any), else the bind address, with the loopback names when it is loopback. A server bound
    to every interface has no one name to check, so it answers any (None)."""
    names = [h.strip().lower() for item in given for h in item.split(",") if h.strip()]
    if names:
        return None if "*" in names else frozenset(names)
    bind = bind.strip().lower().strip("[]")
    if bind in _WILDCARD_BINDS:
        return None
    if bind in _LOOPBACK_NAMES or _is_loopback(bind):
        return _LOOPBACK_NAMES | {bind}
    return frozenset({bind})


def host_name(header: str) -> str:
    """ "[::1]:8000" -> "::1", "Example.com.:80" -> "example.com"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


class Guard:
    """ASGI middleware: refuses what the policy does not let through, in OpenAI's shape."""

    def __init__(self, app: ASGIApp, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.check(scope)
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> ApiError | None:
        headers = Headers(scope=scope)
        # a refused request's body is never read: the connection cannot carry another one
        close = {"Connection": "close"} if _has_body(headers) else None
        allowed = self.policy.allowed_hosts
        host = host_name(headers.get("host", ""))
        if allowed is not None and host not in allowed:
            msg = f"the Host {host!r} is not served here; start the server with --allowed-hosts"
            return ApiError(400, msg, code="invalid_host", headers=close)
        keys = self.policy.keys_for(scope["path"])
        given = headers.get("authorization", "")
        if not given and "x-api-key" in headers:  # the anthropic SDK's header for its key
            given = "Bearer " + headers["x-api-key"]
        if keys and not _has_key(given, keys):
            flag = "--metrics-key" if scope["path"] == METRICS_PATH else "--api-key"
            msg = f"missing or incorrect API key (Authorization: Bearer KEY, as {flag} set)"
            return ApiError(401, msg, code="invalid_api_key", headers=close)
        if scope["method"] in _BODY_METHODS and not _is_json(headers.get("content-type")):
            kind = headers.get("content-type") or "none"
            msg = f"the body must be JSON (Content-Type: application/json), not {kind!r}"
            return ApiError(415, msg, code="unsupported_media_type", headers=close)
        return None


def _has_key(header: str, keys: tuple[str, ...]) -> bool:
    scheme, _, token = header.partition(" ")
    given = token.strip().encode()
    # every key is compared, in constant time, so timing tells nothing about which is close
    matches = [hmac.compare_digest(given, k.encode()) for k in keys]
    return scheme.lower() == "bearer" and any(matches)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return "chunked" in headers.get("transfer-encoding", "").lower() or (
        length is not None and length.strip() not in ("", "0")
    )


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False

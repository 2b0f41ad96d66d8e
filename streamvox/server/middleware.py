"""The server's ASGI middleware: request ids, a query's API key out of sight, WebSocket origins, then API keys.

Request ids (`RequestIdMiddleware`, outermost): every HTTP response, errors
and streams included, and every WebSocket handshake carries `x-request-id`:
the client's own when it sent a usable one (1-128 visible ASCII characters),
else a new `req_<hex>`. While the request runs, the id is in a context
variable: `RequestIdLogFilter` puts it in the server's log lines for that
request, and `engine_request_id` into the engine request that serves it.

Origins (`OriginMiddleware`): a WebSocket handshake without an `Origin` header
(a non-browser client) is allowed; a browser's `Origin` is allowed when its
host:port equals the request's `Host` header (the page was served by this
server) or it is listed in `--allowed-origins` (`*` allows every origin). Any
other handshake is refused before it is accepted: the client sees HTTP 403.

API keys (`APIKeyMiddleware`), on every route, HTTP and WebSocket: HTTP and
SDK clients send `Authorization: Bearer <key>`. Browsers cannot set headers on
a WebSocket, so they may offer the subprotocol `openai-insecure-api-key.<key>`
(next to `realtime`) instead. Cartesia's routes (`/tts/...`) also take the key
as their clients send it, in `X-API-Key`, or as `?api_key=` (for browsers), which
`QueryKeyMiddleware` (before the others) takes out of the query string so that
no log line shows it. The static
`/demo` client page needs no key (it holds none; it takes one from its URL).
`/health` needs none either, so that liveness probes (Kubernetes, load
balancers) can call it; without the key it says only up or down (the route
reads `api_key_valid` from the request state).
A refused WebSocket is closed before it is accepted (the client sees HTTP 403).
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import re
import urllib.parse
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamvox.server.demo_page import is_public_path
from streamvox.server.errors import APIError

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
OPEN_PATHS = frozenset({"/health"})  # answered without the API key (up or down only)
CARTESIA_PREFIX = "/tts/"  # Cartesia's routes: `X-API-Key` or `?api_key=` as well
QUERY_KEY = "api_key"
REQUEST_ID_HEADER = b"x-request-id"
_CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")  # visible ASCII: safe in headers and log lines

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("streamvox_request_id", default=None)


def current_request_id() -> str | None:
    """The `x-request-id` of the HTTP request or WebSocket being served, if any."""
    return _request_id.get()


def engine_request_id(prefix: str) -> str:
    """A unique engine request id ending in the `x-request-id` it serves, so the engine's log lines can be
    found by it: `<prefix>_<12 hex>_<id>` (one HTTP request may start several engine requests, and a client
    may reuse its ids); outside a request, `<prefix>_<32 hex>`."""
    value = current_request_id()
    unique = uuid.uuid4().hex
    return f"{prefix}_{unique[:12]}_{value}" if value is not None else f"{prefix}_{unique}"


class RequestIdLogFilter(logging.Filter):
    """Gives every log record `request_id` (`-` outside a request) and `request_tag` (`[id] `, or empty)."""

    def filter(self, record: logging.LogRecord) -> bool:
        value = current_request_id()
        record.request_id = value or "-"
        record.request_tag = f"[{value}] " if value else ""
        return True


def _with_request_id(headers: list[tuple[bytes, bytes]], value: bytes) -> list[tuple[bytes, bytes]]:
    return [(name, v) for name, v in headers if name.lower() != REQUEST_ID_HEADER] + [(REQUEST_ID_HEADER, value)]


class RequestIdMiddleware:
    """`x-request-id` on every response and handshake; the id in a context variable while the request runs."""

    _RESPONSE_STARTS = ("http.response.start", "websocket.accept", "websocket.http.response.start")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        sent = next((value for name, value in scope.get("headers", []) if name == REQUEST_ID_HEADER), None)
        if sent is not None and _CLIENT_REQUEST_ID.fullmatch(sent):
            request_id = sent.decode("ascii")
        else:
            request_id = f"req_{uuid.uuid4().hex}"
        encoded = request_id.encode("ascii")

        async def send_with_id(message: Message) -> None:
            if message["type"] in self._RESPONSE_STARTS:
                message = {**message, "headers": _with_request_id(message.get("headers") or [], encoded)}
            await send(message)

        token = _request_id.set(request_id)
        await self.app(scope, receive, send_with_id)
        # Not reset on an exception: uvicorn's "Exception in ASGI application" line then carries the id too
        # (each request runs in a task of its own, whose context ends with it).
        _request_id.reset(token)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return None


def _subprotocol_key(scope: Scope) -> str | None:
    for protocol in scope.get("subprotocols", []):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def _x_api_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


class QueryKeyMiddleware:
    """Moves a Cartesia route's `?api_key=` out of its query string into the request state (where
    `APIKeyMiddleware` reads it) before anything can refuse the request: no access log line shows the key."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        if scope["type"] in ("http", "websocket") and scope["path"].startswith(CARTESIA_PREFIX) and QUERY_KEY in query:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            key = next((value for name, value in pairs if name == QUERY_KEY), None)
            scope["query_string"] = urllib.parse.urlencode([(n, v) for n, v in pairs if n != QUERY_KEY]).encode()
            scope.setdefault("state", {})[QUERY_KEY] = key
        await self.app(scope, receive, send)


def _offered_keys(scope: Scope) -> list[str | None]:
    keys = [_bearer(scope)]
    if scope["type"] == "websocket":
        keys.append(_subprotocol_key(scope))
    if scope["path"].startswith(CARTESIA_PREFIX):
        keys += [_x_api_key(scope), scope.get("state", {}).get(QUERY_KEY)]
    return keys


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    def _allowed(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        allowed = any(self._allowed(key) for key in _offered_keys(scope))
        if scope["type"] == "http" and scope["path"] in OPEN_PATHS:
            scope.setdefault("state", {})["api_key_valid"] = allowed
        elif scope["type"] == "http" and not is_public_path(scope["path"]) and not allowed:
            how = "'X-API-Key: <key>' or " if scope["path"].startswith(CARTESIA_PREFIX) else ""
            error = APIError(401, f"Missing or invalid API key: send {how}'Authorization: Bearer <key>'.")
            await error.response()(scope, receive, send)
            return
        if scope["type"] == "websocket" and not allowed:
            await send({"type": "websocket.close", "code": 1008, "reason": "invalid API key"})
            return
        await self.app(scope, receive, send)


def _origin_key(value: str) -> str | None:
    """`scheme://host[:port]` -> `host:port` in lower case, default ports filled in."""
    parts = urllib.parse.urlsplit(value.strip())
    if not parts.hostname:
        return None
    try:
        port = parts.port or {"http": 80, "ws": 80, "https": 443, "wss": 443}.get(parts.scheme)
    except ValueError:
        return None
    return f"{parts.hostname.lower()}:{port}"


def _host_key(host: str, scheme_port: int) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        name, _, rest = host[1:].partition("]")
        port = rest.lstrip(":") or str(scheme_port)
        return f"{name}:{port}"
    name, _, port = host.partition(":")
    return f"{name}:{port or scheme_port}"


class OriginMiddleware:
    """Refuse WebSocket handshakes from foreign browser origins before they are accepted."""

    def __init__(self, app: ASGIApp, allowed_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allow_all = "*" in allowed_origins
        self.allowed = {key for o in allowed_origins if o != "*" and (key := _origin_key(o))}
        self.allowed_exact = {o.strip().lower().rstrip("/") for o in allowed_origins}

    def allowed_origin(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin")
        if origin is None or self.allow_all:
            return True
        origin_text = origin.decode("latin-1")
        if origin_text.strip().lower().rstrip("/") in self.allowed_exact:
            return True
        key = _origin_key(origin_text)
        if key is None:  # "null" (sandboxed frames, file: pages) and garbage
            return False
        if key in self.allowed:
            return True
        host = headers.get(b"host")
        default_port = 443 if scope.get("scheme") in ("wss", "https") else 80
        return host is not None and _host_key(host.decode("latin-1"), default_port) == key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not self.allowed_origin(scope):
            await send({"type": "websocket.close", "code": 1008, "reason": "origin not allowed"})
            return
        await self.app(scope, receive, send)

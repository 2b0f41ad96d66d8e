"""The server's ASGI middleware: WebSocket origins, then API keys.

Origins (`OriginMiddleware`): a WebSocket handshake without an `Origin` header
(a non-browser client) is allowed; a browser's `Origin` is allowed when its
host:port equals the request's `Host` header (the page was served by this
server) or it is listed in `--allowed-origins` (`*` allows every origin). Any
other handshake is refused before it is accepted: the client sees HTTP 403.

API keys (`APIKeyMiddleware`), on every route, HTTP and WebSocket: HTTP and
SDK clients send `Authorization: Bearer <key>`. Browsers cannot set headers on
a WebSocket, so they may offer the subprotocol `openai-insecure-api-key.<key>`
(next to `realtime`) instead. The static `/demo` client page needs no key (it
holds none; it takes one from its URL). A refused WebSocket is closed before it
is accepted (the client sees HTTP 403).
"""

from __future__ import annotations

import hmac
import urllib.parse

from starlette.types import ASGIApp, Receive, Scope, Send

from streamvox.server.demo_page import is_public_path
from streamvox.server.errors import APIError

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


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


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    def _allowed(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_public_path(scope["path"]) and not self._allowed(_bearer(scope)):
            error = APIError(401, "Missing or invalid API key: send 'Authorization: Bearer <key>'.")
            await error.response()(scope, receive, send)
            return
        if scope["type"] == "websocket" and not (
            self._allowed(_bearer(scope)) or self._allowed(_subprotocol_key(scope))
        ):
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

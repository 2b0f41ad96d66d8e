"""API-key authentication for every route, HTTP and WebSocket, as ASGI middleware.

HTTP and SDK clients send `Authorization: Bearer <key>`. Browsers cannot set
headers on a WebSocket, so they may offer the subprotocol
`openai-insecure-api-key.<key>` (next to `realtime`) instead. The static
`/demo` client page needs no key (it holds none; it takes one from its URL). A refused
WebSocket is closed before it is accepted (the client sees HTTP 403).
"""

from __future__ import annotations

import hmac

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

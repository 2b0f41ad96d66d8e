"""The ASGI layer around a replica's StreamVox app.

- Names the replica on every response (`x-streamvox-replica`: HTTP responses, WebSocket accepts
  and denials), so operators and tests can tell where a request went.
- Drops the client-control headers again (see `proxy`), in case a request reaches the replica by
  another way than StreamVox's proxy middleware.
- Runs the replica's half of the flow control (`flow.SendWindow`) when the proxy offers it.
- Brings the replica's cloned voices up to date with the shared store (`VoiceSync`) before a
  request that may name one, and serialises voice uploads and deletes with that.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamvox.scale.flow import FLOW_HEADER, SendWindow
from streamvox.scale.proxy import CONTROL_HEADERS, REPLICA_HEADER, without_control_headers
from streamvox.scale.voice_sync import VoiceSync

_NAMED = ("http.response.start", "websocket.accept", "websocket.http.response.start")


def _route_path(scope: Scope) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _may_name_a_voice(path: str) -> bool:
    return path.startswith(("/v1/audio/", "/tts/")) or path == "/v1/realtime"


class ReplicaMiddleware:
    def __init__(self, app: ASGIApp, replica: str, voices: VoiceSync | None = None) -> None:
        self.app = app
        self.replica = replica.encode()
        self.voices = voices

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        flow = any(name == FLOW_HEADER for name, _ in headers)
        if any(name.lower() in CONTROL_HEADERS for name, _ in headers):
            scope = {**scope, "headers": without_control_headers(headers)}
        send = self._naming(send)
        window = None
        if flow:
            window = SendWindow(receive, send)
            receive, send = window.receive, window.send
        try:
            path = _route_path(scope)
            if self.voices is None or not _may_name_a_voice(path):
                await self.app(scope, receive, send)
            elif scope["type"] == "http" and scope["method"] in ("POST", "DELETE") \
                    and path.startswith("/v1/audio/voices"):
                async with self.voices.changing():
                    await self.app(scope, receive, send)
            else:
                await self.voices.refresh()
                await self.app(scope, receive, send)
        finally:
            if window is not None:
                window.close()

    def _naming(self, send: Send) -> Send:
        header = (REPLICA_HEADER, self.replica)

        async def named(message: Message) -> None:
            if message["type"] in _NAMED:
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        return named

"""StreamVox's middleware inside Ray Serve's proxy, in front of Serve's own request handling.

Serve loads it in every proxy from `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` (`PROXY_CALLBACK`;
`streamvox.scale.launch` sets it for the Serve controller, whose proxies inherit it). It does what
a replica cannot, because Serve acts on these before any replica sees the request:

- Drops the client headers Serve obeys: `x-request-timeout-seconds` would cut a stream or a session
  short, and `x-request-disconnect-disabled` would leave a request running after its client left.
- Reports delivered bytes to the replica (`flow`), so a client that stops reading is cancelled at
  `--max-buffered-audio-s` and the proxy holds at most a window of its stream.
- Gives Serve's own refusals (queue full, no replica) OpenAI's error shape: JSON with 503 (or 429)
  and Retry-After over HTTP, the same as an HTTP denial of a WebSocket handshake (where Serve's own
  answer becomes a 500). A handshake still waiting in Serve's queue after `WEBSOCKET_QUEUE_TIMEOUT_S`
  is refused the same way: clients give up on a handshake after ~10 s on their own.
- Ends a response its replica left unfinished (the replica died) so the client sees it: an SSE
  stream gets an `error` event, a WebSocket a close with 1011; a response not yet started, a 503.
- Answers `PROBE_PATH` itself, so `launch` can tell that the middleware is installed.

A response from a replica carries `x-streamvox-replica`; one without it came from Serve itself.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamvox.scale.flow import FLOW_HEADER, DeliveryReport, payload_size
from streamvox.server.errors import APIError

log = logging.getLogger(__name__)

PROXY_CALLBACK = "streamvox.scale.proxy:proxy_middlewares"
PROBE_PATH = "/-/streamvox-proxy"
REPLICA_HEADER = b"x-streamvox-replica"
# Headers a client must not set: Serve obeys them (and FLOW_HEADER is ours to give).
CONTROL_HEADERS = frozenset({b"x-request-timeout-seconds", b"x-request-disconnect-disabled", FLOW_HEADER})
WEBSOCKET_QUEUE_TIMEOUT_S = 5.0
RETRY_AFTER_S = b"1"


def proxy_middlewares() -> list[Middleware]:
    """What Serve's proxy calls at start (`PROXY_CALLBACK`)."""
    return [Middleware(ProxyMiddleware)]


def without_control_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in headers if name.lower() not in CONTROL_HEADERS]


def _from_replica(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == REPLICA_HEADER for name, _ in headers)


def _serve_refusal(status: int, text: str) -> APIError:
    """Serve's own error response (plain text) as the error StreamVox answers with."""
    if status in (429, 503) and "backpressure" in text.lower():
        return APIError(status, f"Every replica is busy: its streams and the queue in front of it are full; "
                                f"try again shortly. ({text.strip()})", code="server_overloaded")
    return APIError(status if status < 500 else 503, f"No replica could take the request. ({text.strip()})",
                    code="replica_unavailable")


_REPLICA_GONE = APIError(503, "The replica serving this request stopped; try again.", code="replica_unavailable")
_QUEUE_TIMEOUT = APIError(503, f"Every replica is busy: the WebSocket handshake waited "
                               f"{WEBSOCKET_QUEUE_TIMEOUT_S:g} s for a free one; try again shortly.",
                          code="server_overloaded")


def _error_head(error: APIError, headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps(error.body()).encode()
    retry = [(k, v) for k, v in headers if k.lower() == b"retry-after"] or [(b"retry-after", RETRY_AFTER_S)]
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *retry], body


class ProxyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == PROBE_PATH:
            await _answer_probe(send)
            return
        scope = dict(scope)
        scope["headers"] = [*without_control_headers(scope.get("headers", [])), (FLOW_HEADER, b"1")]
        exchange = (_HTTPExchange if scope["type"] == "http" else _WebSocketExchange)(scope, receive, send)
        try:
            await exchange.run(self.app)
        finally:
            exchange.report.close()


async def _answer_probe(send: Send) -> None:
    body = b'{"proxy":"streamvox"}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _Exchange:
    """One request through the proxy: the client's side, and what Serve's side has sent so far."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.report = DeliveryReport(receive)
        self.client_send = send
        self.refusal: tuple[int, list[tuple[bytes, bytes]]] | None = None  # Serve's own error response
        self.refusal_body: list[bytes] = []

    async def forward(self, message: Message) -> None:
        await self.client_send(message)
        self.report.delivered(payload_size(message))

    def hold_refusal(self, message: Message) -> bool:
        """Keep Serve's own `http.response.*` error messages; True when the refusal is complete."""
        if message["type"] == "http.response.start":
            self.refusal = (message["status"], message.get("headers", []))
            return False
        self.refusal_body.append(message.get("body", b""))
        return not message.get("more_body", False)

    def refusal_error(self) -> APIError:
        status, _ = self.refusal
        return _serve_refusal(status, b"".join(self.refusal_body).decode("utf-8", "replace"))


class _HTTPExchange(_Exchange):
    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(scope, receive, send)
        self.started = False
        self.finished = False
        self.event_stream = False

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.report.receive, self.send)
        except Exception:
            log.exception("Serve's proxy failed a request")
        if self.finished or self.report.client_gone:
            return
        if self.refusal is not None:
            await self.answer(self.refusal_error(), self.refusal[1])
        elif not self.started:
            await self.answer(_REPLICA_GONE, [])
        elif self.event_stream:
            event = b"data: " + json.dumps({"type": "error", **_REPLICA_GONE.body()}).encode() + b"\n\n"
            await self.client_send({"type": "http.response.body", "body": event})
        # Any other unfinished stream is cut off: the client sees the body end before its last chunk.

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and message["status"] >= 400 \
                and not _from_replica(message.get("headers", [])):
            self.hold_refusal(message)
            return
        if self.refusal is not None:
            if self.hold_refusal(message):
                await self.answer(self.refusal_error(), self.refusal[1])
            return
        if kind == "http.response.start":
            self.started = True
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            self.event_stream = content_type.startswith(b"text/event-stream")
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self.forward(message)

    async def answer(self, error: APIError, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = self.finished = True
        headers, body = _error_head(error, headers)
        await self.client_send({"type": "http.response.start", "status": error.status, "headers": headers})
        await self.client_send({"type": "http.response.body", "body": body})


class _WebSocketExchange(_Exchange):
    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(scope, receive, send)
        self.decided = asyncio.Event()  # accepted, closed or denied
        self.accepted = False
        self.closed = False
        self.abandoned = False  # refused here after the queue timeout: later messages are dropped

    async def run(self, app: ASGIApp) -> None:
        task = asyncio.ensure_future(app(self.scope, self.report.receive, self.send))
        decided = asyncio.ensure_future(self.decided.wait())
        try:
            done, _ = await asyncio.wait((task, decided), timeout=WEBSOCKET_QUEUE_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                self.abandoned = True
                task.cancel()
                await self.deny(_QUEUE_TIMEOUT, [])
            try:
                await task
            except asyncio.CancelledError:
                if not self.abandoned:
                    raise
            except Exception:
                log.exception("Serve's proxy failed a WebSocket")
        finally:
            decided.cancel()
            task.cancel()
        if self.abandoned or self.closed or self.report.client_gone:
            return
        if self.accepted:
            await self.close(1011, "the replica serving this session stopped")
        elif self.refusal is not None:
            await self.deny(self.refusal_error(), self.refusal[1])
        else:
            await self.deny(_REPLICA_GONE, [])

    async def send(self, message: Message) -> None:
        if self.abandoned:
            return
        kind = message["type"]
        if kind.startswith("http.response."):  # Serve's own refusal of the handshake
            if self.hold_refusal(message):
                await self.deny(self.refusal_error(), self.refusal[1])
            return
        if kind == "websocket.accept":
            self.accepted = True
        elif kind in ("websocket.close", "websocket.http.response.start"):
            self.closed = True
        if kind != "websocket.send":
            self.decided.set()
        await self.forward(message)

    async def deny(self, error: APIError, headers: list[tuple[bytes, bytes]]) -> None:
        """Refuse the handshake with an HTTP error response, where the server can send one."""
        self.closed = True
        self.decided.set()
        if "websocket.http.response" not in self.scope.get("extensions", {}):
            await self.client_send({"type": "websocket.close", "code": 1013, "reason": error.message[:120]})
            return
        headers, body = _error_head(error, headers)
        await self.client_send({"type": "websocket.http.response.start", "status": error.status, "headers": headers})
        await self.client_send({"type": "websocket.http.response.body", "body": body})

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        try:
            await self.client_send({"type": "websocket.close", "code": code, "reason": reason})
        except (OSError, RuntimeError) as exc:  # the client left meanwhile
            log.debug("closing a WebSocket failed: %s", exc)

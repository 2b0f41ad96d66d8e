"""Small pieces shared by the WebSocket protocols: serialised sends, bounded JSON decoding, the idle timeout."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from streamvox.server.errors import APIError

log = logging.getLogger(__name__)

# Frames larger than this are decoded in a worker thread, not on the event loop.
OFFLOAD_BYTES = 1 << 20

def accepted_subprotocol(websocket: WebSocket, preferred: str | None = None) -> str | None:
    """The subprotocol to echo: a browser refuses the connection unless one it offered comes back.

    `preferred` when offered, else the first offered protocol that is not the API-key carrier,
    else the key carrier itself (browsers that only send a key still need an echo).
    """
    offered = websocket.scope.get("subprotocols", [])
    if preferred in offered:
        return preferred
    plain = [p for p in offered if not p.startswith("openai-insecure-api-key.")]
    return (plain or offered or [None])[0]


async def accept_when_ready(websocket: WebSocket, preferred_subprotocol: str | None = None) -> bool:
    """Accept the handshake (echoing a subprotocol) once the engine serves; else close it with 1013, try again
    later, and return False. Auth and origin were checked by the middleware before this runs."""
    engine = websocket.app.state.streamvox.engine
    if engine.info is None or not engine.is_ready:
        await websocket.close(1013, "the speech engine is not ready")
        return False
    await websocket.accept(subprotocol=accepted_subprotocol(websocket, preferred_subprotocol))
    return True


def text_size(text: str) -> int:
    """UTF-8 size of a frame; cheap for the (usual) ASCII case."""
    return len(text) if text.isascii() else len(text.encode())


async def decode_json_event(message: dict, max_bytes: int) -> dict:
    """An ASGI `websocket.receive` message -> a JSON object with a string `type`, or an `APIError`."""
    text = message.get("text")
    if text is None:
        raise APIError(400, "Binary frames are not accepted here; send each event as a JSON text frame.",
                       code="invalid_frame")
    size = text_size(text)
    if size > max_bytes:
        raise APIError(400, f"The event is {size} bytes; the limit is {max_bytes} bytes.", code="event_too_large")
    try:
        event = await asyncio.to_thread(msgspec.json.decode, text) if size > OFFLOAD_BYTES \
            else msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise APIError(400, f"The event is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(event, dict):
        raise APIError(400, "An event must be a JSON object.", code="invalid_event")
    if not isinstance(event.get("type"), str):
        raise APIError(400, "The event has no string 'type' field.", code="invalid_event")
    return event


class Sender:
    """Serialises sends from several tasks on one WebSocket; a failed send marks it closed.

    A send that waits longer than `stall_limit_s` (the client read nothing meanwhile: the socket
    buffers stayed full) marks the sender closed and `stalled`; the session then ends its request
    as a slow consumer (docs/LIMITS.md), and `serve` stops waiting for the client's next message.
    """

    def __init__(self, websocket: WebSocket, stall_limit_s: float = 300.0) -> None:
        self.websocket = websocket
        self.stall_limit_s = stall_limit_s
        self.closed = False
        self.stalled = False
        self._on_stall: Callable[[], object] | None = None
        self._lock = asyncio.Lock()

    async def serve(self, session: Awaitable[None]) -> None:
        """Run a session's reader, then close; a stall ends the reader (the client reads nothing, so
        it will not answer a close either: its connection goes with the keep-alive ping)."""
        task = asyncio.current_task()
        self._on_stall = task.cancel
        try:
            await session
        except asyncio.CancelledError:
            if not self.stalled:
                raise
            task.uncancel()
        finally:
            self._on_stall = None
            await self.close(1000)

    async def json(self, payload: dict) -> bool:
        return await self._send({"type": "websocket.send", "text": msgspec.json.encode(payload).decode()})

    async def binary(self, data: bytes) -> bool:
        return await self._send({"type": "websocket.send", "bytes": data})

    async def _send(self, message: dict) -> bool:
        if self.closed:
            return False
        async with self._lock:
            if self.closed:
                return False
            try:
                async with asyncio.timeout(self.stall_limit_s):
                    await self.websocket.send(message)
                return True
            except TimeoutError:
                log.warning("a WebSocket client read nothing for %g s; dropping it", self.stall_limit_s)
                self.closed = self.stalled = True
                if self._on_stall is not None:
                    self._on_stall()
                return False
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True
                return False

    async def close(self, code: int = 1000, reason: str = "") -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.websocket.application_state == WebSocketState.CONNECTED:
                try:
                    await self.websocket.close(code, reason)
                except (WebSocketDisconnect, RuntimeError, OSError) as exc:  # the client left first
                    log.debug("close failed: %s", exc)


async def close_when_idle(sender: Sender, timeout_s: float, idle_since: Callable[[], float | None],
                          send_error: Callable[[APIError], Awaitable[object]]) -> None:
    """Run beside a session's reader: once `idle_since()` (a `time.monotonic()` instant; None while the
    session is working for its client) is `timeout_s` back, send the protocol's `error` (`idle_timeout`)
    and close with 1000."""
    while not sender.closed:
        await asyncio.sleep(min(1.0, timeout_s / 4))
        since = idle_since()
        if since is not None and time.monotonic() - since > timeout_s:
            await send_error(APIError(400, f"The session was idle for {timeout_s:g} s and is closed.",
                                      code="idle_timeout"))
            await sender.close(1000, "idle timeout")
            return

"""Flow control between Serve's proxy and a replica: a client that stops reading slows its replica down.

Serve's proxy pulls a replica's response messages as fast as the replica sends them and keeps them
for a slow client, so without more a client that stops reading makes the proxy hold its whole
stream, and the replica never notices: `--max-buffered-audio-s` is enforced where the server's
writes to its client stop completing. The two halves here carry that signal across Ray:

- in the proxy, `DeliveryReport` counts the bytes the client's connection took (uvicorn's send
  returns only once the client's socket accepts more) and, every `ACK_STEP_BYTES`, slips an ack
  into the request's receive channel, which Serve already carries from the proxy to the replica;
- in the replica, `SendWindow` counts the bytes the app sent and holds its next send while more than
  `WINDOW_BYTES` are unacknowledged. The route then stops draining its engine request, and the
  engine's limit cancels it as it does without Ray. Memory in the proxy stays within the window.

A replica uses the window only for requests that carry `FLOW_HEADER`, which StreamVox's proxy
middleware adds (after removing any a client sent): a proxy without it sends no acks, and a
replica must never wait for acks that do not come.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Receive, Send

FLOW_HEADER = b"x-streamvox-flow"
ACK = "streamvox.flow.ack"  # the message type; `delivered` is the running byte count
# An ack is one more message from the proxy to the replica: at eSpeak's speed (~6 MB/s of SSE a stream) a small
# step costs the proxy's CPU. The window holds several steps, so a reading client's sender rarely waits, and
# must hold more than one: the last partial step is never acked.
ACK_STEP_BYTES = 512 * 1024
WINDOW_BYTES = 2 * 1024 * 1024


def payload_size(message: Message) -> int:
    """Bytes of response payload an ASGI send message carries (body or WebSocket frame)."""
    kind = message["type"]
    if kind == "http.response.body":
        return len(message.get("body", b""))
    if kind == "websocket.send":
        text = message.get("text")
        return len(text) if text is not None else len(message.get("bytes") or b"")
    return 0


class DeliveryReport:
    """Proxy side: the client's receive channel, with acks of the delivered bytes slipped in between."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._pending: asyncio.Future | None = None  # the client's next message, while awaited
        self._delivered = 0
        self._acked = 0
        self._ack_due = asyncio.Event()
        self.client_gone = False  # the client's disconnect went by

    def delivered(self, nbytes: int) -> None:
        self._delivered += nbytes
        if self._delivered - self._acked >= ACK_STEP_BYTES:
            self._ack_due.set()

    async def receive(self) -> Message:
        while True:
            if self._ack_due.is_set():
                self._ack_due.clear()
                self._acked = self._delivered
                return {"type": ACK, "delivered": self._delivered}
            if self._pending is None:
                self._pending = asyncio.ensure_future(self._receive())
            ack = asyncio.ensure_future(self._ack_due.wait())
            try:
                await asyncio.wait((self._pending, ack), return_when=asyncio.FIRST_COMPLETED)
            finally:
                ack.cancel()
            if self._pending.done():
                pending, self._pending = self._pending, None
                message = pending.result()
                if message["type"] in ("http.disconnect", "websocket.disconnect"):
                    self.client_gone = True
                return message

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class SendWindow:
    """Replica side: the app's receive without the acks, and a send that waits while the window is full."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._messages: asyncio.Queue[Any] = asyncio.Queue()
        self._final: Message | None = None  # the disconnect, repeated once it has been received
        self._sent = 0
        self._acked = 0
        self._open = True
        self._progress = asyncio.Event()
        self._pump = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == ACK:
                    self._acked = max(self._acked, message["delivered"])
                    self._progress.set()
                    continue
                self._messages.put_nowait(message)
                if message["type"] in ("http.disconnect", "websocket.disconnect"):
                    return
        except Exception as exc:  # handed to the app's next receive
            self._messages.put_nowait(exc)
        finally:
            self._open = False
            self._progress.set()

    async def receive(self) -> Message:
        if self._final is not None and self._messages.empty():
            return self._final
        message = await self._messages.get()
        if isinstance(message, Exception):
            raise message
        if message["type"] in ("http.disconnect", "websocket.disconnect"):
            self._final = message
        return message

    async def send(self, message: Message) -> None:
        await self._send(message)
        size = payload_size(message)
        if not size:
            return
        self._sent += size
        while True:
            self._progress.clear()
            if not self._open or self._sent - self._acked <= WINDOW_BYTES:
                return
            await self._progress.wait()

    def close(self) -> None:
        self._pump.cancel()

"""What the parts of one `/v1/realtime` connection share: its wire, its config, its conversation and input audio.

The endpoint reads client events and hands them to the responses (responses.py) and the agent turns
(turns.py); all three work on one `SessionState`. Every server event goes out through `send`, so events get
ids and never interleave mid-frame.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from streamvox.engine.client import AsyncEngine
from streamvox.server.errors import APIError
from streamvox.server.metrics import Metrics
from streamvox.server.realtime.conversation import Conversation
from streamvox.server.realtime.protocol import Dialect, SessionConfig, default_config, event_name, new_id
from streamvox.server.websocket import Sender


class SessionState:
    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics, dialect: Dialect) -> None:
        self.id = new_id("sess")
        self.sender = Sender(websocket, engine.max_buffered_audio_s)
        self.dialect = dialect
        self.engine = engine
        self.info = engine.info
        self.metrics = metrics
        self.config: SessionConfig = default_config(self.info, websocket.query_params.get("model"))
        self.conversation = Conversation()
        self.input_audio = bytearray()  # appended since the last commit or clear
        self.input_audio_ms = 0.0  # input audio appended in the session, in milliseconds
        self.input_audio_start_ms = 0.0  # where `input_audio` starts, in the same count

    def append_input_audio(self, data: bytes) -> None:
        self.input_audio += data
        self.input_audio_ms += len(data) * 1000 / self.config.input_format.bytes_per_second

    def take_input_audio(self, start_ms: float | None = None, end_ms: float | None = None) -> bytes:
        """The buffered input audio from `start_ms` to `end_ms` (session positions; None: the buffer's start,
        its end). What follows `end_ms` stays buffered; what precedes `start_ms` is dropped."""
        fmt = self.config.input_format
        sample_bytes = 2 if fmt.encoding == "pcm16" else 1

        def offset(ms: float | None, default: int) -> int:
            if ms is None:
                return default
            at = int((ms - self.input_audio_start_ms) * fmt.bytes_per_second / 1000) // sample_bytes * sample_bytes
            return min(max(at, 0), len(self.input_audio))

        end = offset(end_ms, len(self.input_audio))
        data = bytes(self.input_audio[offset(start_ms, 0):end])
        del self.input_audio[:end]
        self.input_audio_start_ms = self.input_audio_ms - len(self.input_audio) * 1000 / fmt.bytes_per_second
        return data

    async def send(self, event_type: str, **fields) -> bool:
        return await self.sender.json({"type": event_type, "event_id": new_id("event"), **fields})

    def event_name(self, key: str) -> str:
        """A server event whose name differs between the dialects (see `protocol.event_name`)."""
        return event_name(self.dialect, key)

    async def send_error(self, error: APIError, client_event_id: str | None) -> None:
        """An `error` event: the client's mistake, or with a 5xx status the server's; the session goes on."""
        error_type = error.body()["error"]["type"]
        await self.send("error", error={"type": error_type, "code": error.code, "message": error.message,
                                        "param": error.param, "event_id": client_event_id})

    async def announce_item(self, item: dict, previous_item_id: str | None) -> None:
        """A completed item was added to the conversation."""
        if self.dialect is Dialect.GA:
            await self.send("conversation.item.added", previous_item_id=previous_item_id, item=item)
            await self.send("conversation.item.done", previous_item_id=previous_item_id, item=item)
        else:
            await self.send("conversation.item.created", previous_item_id=previous_item_id, item=item)

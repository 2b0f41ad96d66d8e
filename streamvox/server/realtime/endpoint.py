"""`WS /v1/realtime`: the OpenAI Realtime protocol (GA and beta dialects) over the engine.

One `RealtimeSession` per connection. It reads client events one at a time and dispatches each to its
handler: the session config and the conversation are handled here, responses in responses.py, input audio
turns and the voice agent in turns.py. A response runs in its own task, so the reader keeps going while it
streams (and a `response.cancel` stops it promptly).

Without a thinker the responder is "echo" (it speaks the response's input items, else its instructions, else
the latest user text), and without a speech recogniser `input_audio_buffer.commit` is answered with an error.
With `serve --llm/--llm-url/--asr` the thinker writes the reply, committed audio is transcribed and server VAD
barges in. The session object says which under `"streamvox": {"responder", "thinker", "asr"}`.

Limits (per connection):
- an event is at most 15 MiB (`MAX_EVENT_BYTES`); larger frames up to the
  transport's 16 MiB get an `error` event, beyond that the transport closes
  the connection with 1009;
- the input audio buffer holds at most 15 minutes of audio per turn;
- the conversation keeps the latest 1000 items and at most 64 MiB of
  client-sent base64 audio;
- a response speaks at most 16384 characters;
- with no client event and no running response for the idle timeout
  (`ServerEnv.realtime_idle_timeout_s`), the server sends an `error` event
  (`idle_timeout`) and closes with 1000.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time

from starlette.websockets import WebSocket

from streamvox.agent.responder import Responder
from streamvox.agent.turn_state import TurnState
from streamvox.engine.client import AsyncEngine
from streamvox.server.errors import APIError
from streamvox.server.metrics import Metrics
from streamvox.server.realtime.conversation import validate_item
from streamvox.server.realtime.protocol import Dialect, apply_session_update
from streamvox.server.realtime.responses import Responses
from streamvox.server.realtime.session import SessionState
from streamvox.server.realtime.spoken_words import heard_transcript
from streamvox.server.realtime.turns import AudioTurns, ThinkerReplies
from streamvox.server.websocket import OFFLOAD_BYTES, accept_when_ready, close_when_idle, decode_json_event

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 15 * 1024 * 1024
MAX_INPUT_AUDIO_SECONDS = 15 * 60


def _beta_requested(websocket: WebSocket) -> bool:
    for name, value in websocket.scope.get("headers", []):
        if name == b"openai-beta" and b"realtime=v1" in value.replace(b" ", b""):
            return True
    return False


class RealtimeSession:
    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics, dialect: Dialect,
                 responder: Responder | None, idle_timeout_s: float) -> None:
        self.websocket = websocket
        self.state = SessionState(websocket, engine, metrics, dialect)
        self.responder = responder
        self.turns = TurnState()
        thinking = None
        if responder is not None and responder.thinker is not None:
            thinking = ThinkerReplies(self.state, responder, self.turns)
        self.responses = Responses(self.state, thinking)
        transcriber = responder.transcriber if responder is not None else None
        self.audio_turns = AudioTurns(self.state, self.turns, self.responses, transcriber)
        self.last_activity = time.monotonic()
        self.idle_timeout_s = idle_timeout_s
        self.handlers = {
            "session.update": self.session_update,
            "input_audio_buffer.append": self.input_audio_append,
            "input_audio_buffer.commit": self.input_audio_commit,
            "input_audio_buffer.clear": self.input_audio_clear,
            "conversation.item.create": self.item_create,
            "conversation.item.retrieve": self.item_retrieve,
            "conversation.item.truncate": self.item_truncate,
            "conversation.item.delete": self.item_delete,
            "response.create": self.response_create,
            "response.cancel": self.response_cancel,
            "output_audio_buffer.clear": self.output_audio_clear,
        }

    def session_object(self) -> dict:
        s = self.state
        agent = self.responder.describe() if self.responder is not None else None
        return s.config.render(s.dialect, s.id, s.info, agent)

    async def run(self) -> None:
        s = self.state
        s.metrics.sessions.inc()
        watchdog = asyncio.create_task(close_when_idle(s.sender, self.idle_timeout_s, self._idle_since,
                                                       lambda error: s.send_error(error, None)))
        try:
            await s.send("session.created", session=self.session_object())
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self.last_activity = time.monotonic()
                await self._handle(message)
                if s.sender.closed:
                    break
        finally:
            watchdog.cancel()
            self.turns.close()
            await self.responses.stop("client_disconnected", wait=False)
            s.metrics.sessions.dec()

    async def _handle(self, message: dict) -> None:
        client_event_id = None
        try:
            event = await decode_json_event(message, MAX_EVENT_BYTES)
            client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            handler = self.handlers.get(event["type"])
            if handler is None:
                raise APIError(400, f"Unknown event type '{event['type']}'.", param="type", code="unknown_event_type")
            await handler(event)
        except APIError as error:
            await self.state.send_error(error, client_event_id)
        except Exception:  # a bug must not end the session
            log.exception("realtime event handler failed")
            await self.state.send_error(APIError(500, "The server failed to handle the event.",
                                                 code="server_error"), client_event_id)

    def _idle_since(self) -> float | None:
        if self.responses.current is not None:
            return None
        return max(self.last_activity, self.responses.ended_at)

    # session and input audio

    async def session_update(self, event: dict) -> None:
        """Valid fields apply; each invalid one gets an `error` naming it (and keeps its value)."""
        s = self.state
        s.config, errors = apply_session_update(s.config, event.get("session"), s.info)
        client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        for error in errors:
            await s.send_error(error, client_event_id)
        await s.send("session.updated", session=self.session_object())

    async def input_audio_append(self, event: dict) -> None:
        s = self.state
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise APIError(400, "'audio' must be a base64 string.", param="audio", code="missing_required_parameter")
        try:
            data = (await asyncio.to_thread(base64.b64decode, audio, validate=True) if len(audio) > OFFLOAD_BYTES
                    else base64.b64decode(audio, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise APIError(400, "'audio' is not valid base64.", param="audio") from exc
        fmt = s.config.input_format
        if fmt.encoding == "pcm16" and len(data) % 2:
            raise APIError(400, "pcm16 audio must hold a whole number of 2-byte samples.", param="audio")
        limit = fmt.bytes_per_second * MAX_INPUT_AUDIO_SECONDS
        if len(s.input_audio) + len(data) > limit:
            raise APIError(400, f"The input audio buffer would exceed {MAX_INPUT_AUDIO_SECONDS // 60} minutes of "
                                "audio; commit or clear it first.", param="audio", code="input_audio_buffer_full")
        start_ms = s.input_audio_ms
        s.append_input_audio(data)  # upstream sends no acknowledgement
        await self.audio_turns.on_input_audio(data, start_ms)

    async def input_audio_commit(self, event: dict) -> None:
        await self.audio_turns.commit()

    async def input_audio_clear(self, event: dict) -> None:
        await self.audio_turns.clear()

    # conversation

    async def item_create(self, event: dict) -> None:
        s = self.state
        item = validate_item(event.get("item"))
        previous = s.conversation.insert(item, event.get("previous_item_id"))
        await s.announce_item(item, previous)

    async def item_retrieve(self, event: dict) -> None:
        item = self.state.conversation.get(event.get("item_id"))
        await self.state.send("conversation.item.retrieved", item=item)

    async def item_delete(self, event: dict) -> None:
        item_id = event.get("item_id")
        self.state.conversation.delete(item_id)
        await self.state.send("conversation.item.deleted", item_id=item_id)

    async def item_truncate(self, event: dict) -> None:
        """Checked before a running response of the item is stopped: a refused truncate changes nothing."""
        s = self.state
        item = s.conversation.get(event.get("item_id"))
        content_index, audio_end_ms = event.get("content_index", 0), event.get("audio_end_ms")
        if item.get("role") != "assistant":
            raise APIError(400, "Only assistant messages can be truncated.", param="item_id")
        if isinstance(content_index, bool) or not isinstance(content_index, int) or content_index < 0:
            raise APIError(400, "'content_index' must point at an audio content part.", param="content_index")
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
            raise APIError(400, "'audio_end_ms' must be a non-negative integer.", param="audio_end_ms",
                           code="missing_required_parameter" if audio_end_ms is None else "invalid_value")
        running = self.responses.current
        if running is not None and running.item_id == item["id"]:  # a barge-in on what is still being spoken
            if not running.audio or content_index != 0:
                raise APIError(400, "'content_index' must point at an audio content part.", param="content_index")
            _check_audio_end(audio_end_ms, s.conversation.audio_ms.get(item["id"], 0))  # (sent so far)
            await self.responses.stop("client_cancelled")
            item = s.conversation.get(item["id"])  # now holding what was sent
        if not content_index < len(item["content"]) \
                or item["content"][content_index].get("type") not in ("output_audio", "audio"):
            raise APIError(400, "'content_index' must point at an audio content part.", param="content_index")
        available = s.conversation.audio_ms.get(item["id"], 0)
        _check_audio_end(audio_end_ms, available)
        s.conversation.audio_ms[item["id"]] = audio_end_ms
        if (latest := self.responses.latest) is not None and latest.item_id == item["id"]:
            latest.cut_ms = audio_end_ms
        part = item["content"][content_index]  # upstream drops its transcript; word timings keep the words heard
        part["transcript"] = heard_transcript(s.conversation, item["id"], part.get("transcript") or "", audio_end_ms,
                                              available)
        await s.send("conversation.item.truncated", item_id=item["id"], content_index=content_index,
                     audio_end_ms=audio_end_ms)

    # responses

    async def response_create(self, event: dict) -> None:
        await self.responses.create(event.get("response"))

    async def response_cancel(self, event: dict) -> None:
        response_id = event.get("response_id")
        current = self.responses.current
        if current is None or (response_id is not None and response_id != current.id):
            raise APIError(400, "There is no active response to cancel" + (
                f" with id {response_id!r}." if response_id is not None else "."), code="response_cancel_not_active")
        await self.responses.stop("client_cancelled")

    async def output_audio_clear(self, event: dict) -> None:
        """WebSocket clients hold the audio already sent; clearing stops the running response."""
        current = self.responses.current
        response_id = current.id if current is not None else None
        await self.responses.stop("client_cancelled")
        await self.state.send("output_audio_buffer.cleared", response_id=response_id)


async def realtime_endpoint(websocket: WebSocket) -> None:
    """`WS /v1/realtime`; auth is the API-key middleware's job, before this runs."""
    if not await accept_when_ready(websocket, "realtime"):
        return
    app = websocket.app.state.streamvox
    dialect = Dialect.BETA if _beta_requested(websocket) else Dialect.GA
    session = RealtimeSession(websocket, app.engine, app.metrics, dialect, app.responder,
                              app.settings.env.realtime_idle_timeout_s)
    await session.state.sender.serve(session.run())


def _check_audio_end(audio_end_ms: int, available: int) -> None:
    if audio_end_ms > available:
        raise APIError(400, f"The item holds {available} ms of audio, less than audio_end_ms={audio_end_ms}.",
                       param="audio_end_ms")

"""`WS /tts/websocket`: Cartesia's streaming protocol, many contexts per socket, each one engine request.

A context opens with the first message naming its `context_id` (that message's settings hold for the whole
context) and its text goes into the running generation as each message arrives; `continue: false` ends its
input. `{"context_id", "cancel": true}` stops it; closing the socket stops all of them. Contexts run side by
side and apart: each has its own engine request, text and output. Server messages: `chunk` (base64 audio),
`timestamps` (after the audio they cover), then `done`; or an `error` (`done: false`, as LiveKit needs) that
ends the context. An error about a message that names no usable context carries `context_id: null`. A context
whose audio ends before its input does (a length limit) drops the text still sent for it, and its `done` comes
when its input ends.

Limits (per socket): a message is at most 1 MiB, a transcript 65536 characters and a context 200000; at most
64 contexts are open at once. With no client message for 300 s (`STREAMVOX_CARTESIA_IDLE_TIMEOUT_S`) while no
context with complete input is being spoken, the server sends an `error` (`idle_timeout`, `context_id: null`)
and closes with 1000.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field

import msgspec
import pybase64
from starlette.websockets import WebSocket

from streamvox.contract import WordTimings
from streamvox.engine.client import AsyncEngine
from streamvox.server.audio_out import AudioOut, SpeechStats
from streamvox.server.cartesia.params import (
    WEBSOCKET_FIELDS,
    CartesiaSettings,
    optional,
    parse_settings,
    reject_unknown,
)
from streamvox.server.errors import APIError
from streamvox.server.metrics import Metrics
from streamvox.server.middleware import engine_request_id
from streamvox.server.websocket import Sender, accept_when_ready, close_when_idle, text_size

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
MAX_TRANSCRIPT_CHARS = 65536
MAX_CONTEXT_CHARS = 200_000
MAX_OPEN_CONTEXTS = 64
MAX_CONTEXT_ID_CHARS = 256
_ADMISSION_COST_MS = 0.5  # loop time to start one engine request (see routes/speech.py)


@dataclass(eq=False)
class Context:
    id: str
    settings: CartesiaSettings
    pending: list[str] = field(default_factory=list)  # text that came before its engine request was registered
    has_text: bool = False  # some text that is not whitespace came: there is something to say
    chars: int = 0
    last_char: str = ""
    input_done: bool = False
    cancelled: bool = False
    request_id: str | None = None  # once registered, text goes straight to the engine
    task: asyncio.Task | None = None
    spoken: bool = False  # its request ended before its input did: later text is dropped
    final: dict | None = None  # then its `done`, sent when the input ends


class CartesiaSession:
    """One socket: reads messages, runs each context in a task of its own."""

    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics, idle_timeout_s: float) -> None:
        self.websocket = websocket
        self.engine = engine
        self.metrics = metrics
        self.idle_timeout_s = idle_timeout_s
        self.sender = Sender(websocket, engine.max_buffered_audio_s)
        self.contexts: dict[str, Context] = {}  # open: input or audio still to come
        self.tasks: set[asyncio.Task] = set()
        self.last_activity = time.monotonic()  # the latest client message or end of a context's speech

    async def run(self) -> None:
        self.metrics.sessions.inc()
        watchdog = asyncio.create_task(close_when_idle(self.sender, self.idle_timeout_s, self._idle_since,
                                                       lambda error: self.send_error(None, error)))
        try:
            while not self.sender.closed:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self.last_activity = time.monotonic()
                await self.handle(message)
        finally:  # the client left (or stopped reading): every context stops
            watchdog.cancel()
            for context in list(self.contexts.values()):
                self.cancel(context)
            for task in self.tasks:
                task.cancel()
            if self.tasks:
                await asyncio.wait(self.tasks)
            self.metrics.sessions.dec()

    def _idle_since(self) -> float | None:
        """None while a context with complete input is being spoken (one still taking input waits on the
        client)."""
        for context in self.contexts.values():
            if context.input_done and context.task is not None and not context.task.done():
                return None
        return self.last_activity

    async def handle(self, message: dict) -> None:
        try:
            event = _decode(message)
        except APIError as error:
            await self.send_error(None, error)
            return
        context_id = event.get("context_id")
        if not isinstance(context_id, str) or not context_id or len(context_id) > MAX_CONTEXT_ID_CHARS:
            await self.send_error(None, APIError(400, f"Every message needs a 'context_id': a non-empty string of at "
                                                      f"most {MAX_CONTEXT_ID_CHARS} characters.", "context_id"))
            return
        try:
            reject_unknown(event, WEBSOCKET_FIELDS)
            if optional(event, "cancel", bool, False):
                if (context := self.contexts.get(context_id)) is not None:
                    self.cancel(context)
                return
            await self.message(context_id, event)
        except APIError as error:
            if (context := self.contexts.get(context_id)) is not None:
                self.cancel(context)
            await self.send_error(context_id, error)

    async def message(self, context_id: str, event: dict) -> None:
        transcript = event.get("transcript")
        if not isinstance(transcript, str):
            raise APIError(400, "'transcript' must be a string.", "transcript")
        if len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise APIError(400, f"A transcript holds at most {MAX_TRANSCRIPT_CHARS} characters.", "transcript",
                           "transcript_too_long")
        more = optional(event, "continue", bool, False)
        context = self.contexts.get(context_id)
        if context is None:
            if len(self.contexts) >= MAX_OPEN_CONTEXTS:
                raise APIError(400, f"At most {MAX_OPEN_CONTEXTS} contexts may be open on a socket at once.",
                               "context_id", "too_many_contexts")
            context = Context(context_id, parse_settings(event, self.engine.info, websocket=True))
            self.contexts[context_id] = context
        elif context.input_done:
            if not transcript and not more:  # the same flush again (Pipecat's flush_audio): nothing to add
                return
            raise APIError(400, f"Context '{context_id}' already ended its input (continue: false); start a new "
                                "context_id.", "context_id", "context_closed")
        elif context.spoken:  # its audio ended early (a length limit, an error): the rest of its text has none
            if not more:
                self.forget(context)
                if context.final is not None:
                    await self.sender.json(context.final)
            return
        self.add_text(context, transcript)
        if not more:
            context.input_done = True
            if context.request_id is not None:
                self.engine.end_input(context.request_id)
        await self.start_if_due(context)

    def add_text(self, context: Context, text: str) -> None:
        if context.chars + len(text) > MAX_CONTEXT_CHARS:
            raise APIError(400, f"A context holds at most {MAX_CONTEXT_CHARS} characters.", "transcript",
                           "context_too_long")
        if (context.settings.separate_messages and text and context.last_char
                and not context.last_char.isspace() and not text[0].isspace()):
            text = " " + text  # two messages are two units: never one word
        if not text:
            return
        context.chars += len(text)
        context.last_char = text[-1]
        if context.request_id is not None:
            self.engine.feed_text(context.request_id, text)
        else:
            context.pending.append(text)
            context.has_text = context.has_text or not text.isspace()

    async def start_if_due(self, context: Context) -> None:
        """Start speaking once there is something to say (and, for a model without streaming text, all of it)."""
        if context.task is not None:
            return
        if not context.has_text:
            if context.input_done:  # nothing to say
                self.forget(context)
                await self.sender.json(_done(context.id))
            return
        if context.input_done or self.engine.info.streaming_text:
            context.task = asyncio.create_task(self.speak(context))
            self.tasks.add(context.task)
            context.task.add_done_callback(self.tasks.discard)

    def forget(self, context: Context) -> None:
        """From now on a message with this id opens a new context."""
        if self.contexts.get(context.id) is context:
            del self.contexts[context.id]

    def cancel(self, context: Context) -> None:
        """Stop a context now; nothing more is sent for it."""
        context.cancelled = True
        self.forget(context)
        if context.request_id is not None:
            self.engine.cancel(context.request_id)

    async def speak(self, context: Context) -> None:
        try:
            await self._speak(context)
        except Exception:  # a bug: end this context visibly, keep the others going
            log.exception("cartesia context failed")
            if not context.cancelled:
                self.cancel(context)
                await self.send_error(context.id, APIError(500, "The server failed while speaking the context.",
                                                           code="server_error"))
        finally:
            self.last_activity = time.monotonic()

    async def _speak(self, context: Context) -> None:
        await self.engine.turns.wait(_ADMISSION_COST_MS)
        if context.cancelled:
            return
        settings = context.settings
        request = msgspec.structs.replace(settings.request, request_id=engine_request_id("cartesia"),
                                          text="".join(context.pending), text_complete=context.input_done)
        context.pending.clear()
        timed = request.word_timestamps
        async with AudioOut(self.engine, request, SpeechStats(self.metrics, "cartesia")) as out:
            if context.cancelled:
                return
            context.request_id = request.request_id  # registered: from here on text goes straight to it
            if context.pending:
                self.engine.feed_text(request.request_id, "".join(context.pending))
                context.pending.clear()
            if context.input_done and not request.text_complete:
                self.engine.end_input(request.request_id)
            async with aclosing(out.stream() if timed else out.deltas()) as items:
                async for item in items:
                    if context.cancelled or self.sender.closed:
                        return
                    if isinstance(item, WordTimings):
                        await self.sender.json({
                            "type": "timestamps", "context_id": context.id, "status_code": 206, "done": False,
                            "word_timestamps": {"words": item.words, "start": item.start, "end": item.end}})
                    elif data := settings.encode(item):
                        await self.sender.json({"type": "chunk", "context_id": context.id, "status_code": 206,
                                                "done": False, "data": pybase64.b64encode_as_string(data)})
        if context.cancelled or self.sender.closed:
            return
        error = out.result.error
        if context.input_done:
            self.forget(context)
        else:  # more text may still come for it: it is dropped, and `done` waits for the input's end
            context.spoken = True
            context.final = None if error is not None else _done(context.id)
        if error is not None:
            status = 400 if error.is_request_error else 503
            await self.send_error(context.id, APIError(status, error.message, error.param, error.code))
        elif context.input_done:
            await self.sender.json(_done(context.id))

    async def send_error(self, context_id: str | None, error: APIError) -> None:
        payload = {"type": "error", "context_id": context_id, "status_code": error.status, "done": False,
                   "error": error.message, "code": error.code}
        if error.param is not None:
            payload["param"] = error.param
        await self.sender.json(payload)


def _done(context_id: str) -> dict:
    return {"type": "done", "context_id": context_id, "status_code": 200, "done": True}


def _decode(message: dict) -> dict:
    text = message.get("text")
    if text is None:
        raise APIError(400, "Binary frames are not accepted; send each message as a JSON text frame.",
                       code="invalid_frame")
    size = text_size(text)
    if size > MAX_MESSAGE_BYTES:
        raise APIError(400, f"The message is {size} bytes; the limit is {MAX_MESSAGE_BYTES}.",
                       code="message_too_large")
    try:
        event = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise APIError(400, f"The message is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(event, dict):
        raise APIError(400, "A message must be a JSON object.", code="invalid_message")
    return event


async def cartesia_websocket(websocket: WebSocket) -> None:
    """`WS /tts/websocket`; the API key (and origin) were checked by the middleware before this runs."""
    if not await accept_when_ready(websocket):
        return
    state = websocket.app.state.streamvox
    session = CartesiaSession(websocket, state.engine, state.metrics, state.settings.env.cartesia_idle_timeout_s)
    await session.sender.serve(session.run())

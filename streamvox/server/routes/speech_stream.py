"""`WS /v1/audio/speech/stream`: incremental text in (e.g. an LLM token stream), PCM audio out.

Client JSON text frames: `session.config`, `input.text`, `input.done`,
`input.cancel`, `session.close`. Server: `audio.start`, binary frames of s16le
mono PCM deltas, `audio.done`, `error`. The first `input.text` after an
utterance's `input.done` (or `input.cancel`) opens the next utterance;
utterances are spoken one after another, each with its own engine request,
resampler and byte count. Every utterance gets exactly one `audio.start` and
one `audio.done` (`reason`: `stop`, `length`, `cancelled` or `error`), in order.

Text reaches the model as it arrives (`engine.feed_text`) when the model
takes streaming text (`ModelInfo.streaming_text`). `session.config` may set
`text_split` to `sentence` or `clause` to synthesise each complete sentence
(clause) as its own request instead; `auto` (the default) does that for models
without streaming text, and `none` then waits for `input.done`.

An utterance that ends early (`error`, `length`) while its input is open
drops the text still sent for it until its `input.done`.

`input.cancel` stops the open, the running and every queued utterance (barge-in);
with nothing to stop it does nothing. `session.close` finishes the open
utterance as if `input.done` came, lets queued utterances finish, then closes
with 1000.

Limits (per connection):
- a frame is at most 15 MiB (`session.config` may carry `ref_audio`); an
  `input.text` carries at most 65536 characters and an utterance 200000;
- at most 8 utterances wait or run at once;
- with no client message for 300 s (`STREAMVOX_SPEECH_STREAM_IDLE_TIMEOUT_S`)
  while no utterance with complete input is being spoken, the server sends an
  `error` (`idle_timeout`) and closes with 1000.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field

import msgspec
import numpy as np
from starlette.websockets import WebSocket

from streamvox.audio.formats import to_pcm16
from streamvox.audio.resample import Resampler
from streamvox.contract import ModelInfo
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.engine.events import AudioChunk, Done, EngineError
from streamvox.server.errors import APIError
from streamvox.server.metrics import Metrics
from streamvox.server.routes.speech import SpeechStats
from streamvox.server.speech_params import SpeechParams, parse_speech
from streamvox.server.websocket import FrameError, Sender, accepted_subprotocol, decode_json_event, env_seconds
from streamvox.text_split import TextSplitter

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 15 * 1024 * 1024
MAX_TEXT_MESSAGE_CHARS = 65536
MAX_UTTERANCE_CHARS = 200_000
MAX_PENDING_UTTERANCES = 8
DEFAULT_IDLE_TIMEOUT_S = 300.0
TEXT_SPLIT_MODES = ("auto", "none", "sentence", "clause")


class StreamError(Exception):
    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


@dataclass
class StreamConfig:
    params: SpeechParams  # a validated template: voice, language, speed, rate, extensions
    split: str  # "none" | "sentence" | "clause" (resolved from "auto")


def parse_config(event: dict, info: ModelInfo) -> StreamConfig:
    body = {key: value for key, value in event.items() if key not in ("type", "event_id", "text_split")}
    response_format = body.pop("response_format", "pcm")
    if response_format != "pcm":
        raise StreamError("'response_format' must be 'pcm' (s16le mono in binary frames).", param="response_format")
    split = event.get("text_split", "auto")
    if split not in TEXT_SPLIT_MODES:
        raise StreamError(f"'text_split' must be one of {', '.join(TEXT_SPLIT_MODES)}.", param="text_split")
    if split == "auto":
        split = "none" if info.streaming_text else "sentence"
    try:
        params = parse_speech({**body, "input": "-", "response_format": "pcm"}, info, "template")
    except APIError as error:
        raise StreamError(error.message, error.code or "invalid_value", error.param) from error
    return StreamConfig(params, split)


@dataclass
class Utterance:
    index: int
    config: StreamConfig
    pending: list[str] = field(default_factory=list)  # text that arrived before the request started
    chars: int = 0
    input_done: bool = False
    cancelled: bool = False
    finished: bool = False  # spoken (or failed); text still arriving for it is dropped until input.done
    request_id: str | None = None  # the engine request now speaking it
    text_queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # split modes; None ends it
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # input done or cancelled


class SpeechStreamSession:
    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics) -> None:
        self.websocket = websocket
        self.engine = engine
        self.info = engine.info
        self.metrics = metrics
        self.sender = Sender(websocket, engine.max_buffered_audio_s)
        self.config: StreamConfig | None = None
        self.open: Utterance | None = None  # taking input.text now
        self.active: Utterance | None = None  # being spoken now
        self.queue: asyncio.Queue[Utterance | None] = asyncio.Queue()
        self.waiting: list[Utterance] = []  # queued, not started
        self.next_index = 0
        self.last_activity = time.monotonic()
        self.idle_timeout_s = env_seconds("STREAMVOX_SPEECH_STREAM_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)
        self.handlers = {
            "session.config": self.session_config,
            "input.text": self.input_text,
            "input.done": self.input_done,
            "input.cancel": self.input_cancel,
        }

    async def send_error(self, message: str, code: str, param: str | None = None) -> None:
        error = {"type": "error", "message": message, "code": code}
        if param is not None:
            error["param"] = param
        await self.sender.json(error)

    async def run(self) -> None:
        self.metrics.sessions.inc()
        worker = asyncio.create_task(self._worker())
        watchdog = asyncio.create_task(self._watch_idle())
        try:
            while not self.sender.closed:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self.last_activity = time.monotonic()
                try:
                    event = await decode_json_event(message, MAX_FRAME_BYTES)
                    if event["type"] == "session.close":
                        await self._close_gracefully(worker)
                        break
                    handler = self.handlers.get(event["type"])
                    if handler is None:
                        raise StreamError(f"Unknown message type '{event['type']}'.", "unknown_event_type", "type")
                    await handler(event)
                except (StreamError, FrameError) as error:
                    await self.send_error(error.message, error.code, getattr(error, "param", None))
                except Exception:
                    log.exception("speech stream handler failed")
                    await self.send_error("The server failed to handle the message.", "server_error")
        finally:
            watchdog.cancel()
            worker.cancel()
            self.metrics.sessions.dec()

    async def _close_gracefully(self, worker: asyncio.Task) -> None:
        if self.open is not None:
            self._end_input(self.open)
        self.queue.put_nowait(None)
        await worker
        await self.sender.close(1000, "session closed")

    async def _watch_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            speaking = self.active is not None and (self.active.input_done or self.active.cancelled)
            if not speaking and time.monotonic() - self.last_activity > self.idle_timeout_s:
                await self.send_error(f"No message for {self.idle_timeout_s:g} s; the session is closed.",
                                      "idle_timeout")
                await self.sender.close(1000, "idle timeout")
                return

    # client messages

    async def session_config(self, event: dict) -> None:
        if self.open is not None:
            raise StreamError("session.config may only be sent between utterances; send input.done or "
                              "input.cancel first.", "utterance_open")
        if isinstance(event.get("ref_audio"), str):  # decoding reference audio is compute: off the loop
            self.config = await asyncio.to_thread(parse_config, event, self.info)
        else:
            self.config = parse_config(event, self.info)

    async def input_text(self, event: dict) -> None:
        text = event.get("text")
        if not isinstance(text, str):
            raise StreamError("'text' must be a string.", "invalid_value", "text")
        if len(text) > MAX_TEXT_MESSAGE_CHARS:
            raise StreamError(f"An input.text carries at most {MAX_TEXT_MESSAGE_CHARS} characters.",
                              "text_too_long", "text")
        u = self.open
        if u is None:
            if len(self.waiting) + (self.active is not None) >= MAX_PENDING_UTTERANCES:
                raise StreamError(f"At most {MAX_PENDING_UTTERANCES} utterances may wait or run at once; the text "
                                  "was dropped.", "too_many_utterances")
            if self.config is None:
                self.config = parse_config({}, self.info)
            u = Utterance(self.next_index, self.config)
            self.next_index += 1
            self.open = u
            self.waiting.append(u)
            self.queue.put_nowait(u)
        if u.chars + len(text) > MAX_UTTERANCE_CHARS:
            raise StreamError(f"An utterance holds at most {MAX_UTTERANCE_CHARS} characters; the text was dropped.",
                              "utterance_too_long", "text")
        u.chars += len(text)
        if u.finished:  # it ended early (engine error, length limit): the rest of its text has no audio
            return
        if u.config.split != "none":
            u.text_queue.put_nowait(text)
        elif u.request_id is not None:
            self.engine.feed_text(u.request_id, text)
        else:
            u.pending.append(text)

    async def input_done(self, event: dict) -> None:
        if self.open is None:
            raise StreamError("input.done without an open utterance; send input.text first.", "no_open_utterance")
        self._end_input(self.open)

    def _end_input(self, u: Utterance) -> None:
        u.input_done = True
        u.closed.set()
        if u.config.split != "none":
            u.text_queue.put_nowait(None)
        elif u.request_id is not None:
            self.engine.end_input(u.request_id)
        if self.open is u:
            self.open = None

    async def input_cancel(self, event: dict) -> None:
        for u in [self.active, *self.waiting]:
            if u is None or u.cancelled:
                continue
            u.cancelled = True
            u.closed.set()
            u.text_queue.put_nowait(None)
            if u.request_id is not None:
                self.engine.cancel(u.request_id)
        self.open = None

    # speaking

    async def _worker(self) -> None:
        while (u := await self.queue.get()) is not None:
            self.waiting.remove(u)
            self.active = u
            try:
                await self._speak(u)
            except Exception:  # a bug: end this utterance visibly, keep serving the next ones
                log.exception("speech stream utterance %d failed", u.index)
                await self.send_error("The server failed while speaking the utterance.", "server_error")
                await self.sender.json({"type": "audio.done", "utterance_index": u.index, "total_bytes": 0,
                                        "reason": "error"})
            finally:
                u.finished = True
                self.active = None
                self.last_activity = time.monotonic()
            if self.sender.closed:
                return

    async def _speak(self, u: Utterance) -> None:
        params = u.config.params
        await self.sender.json({"type": "audio.start", "utterance_index": u.index, "format": "pcm",
                                "sample_rate": params.sample_rate, "channels": 1})
        resampler = Resampler(self.info.sample_rate, params.sample_rate)
        stats = SpeechStats(self.metrics, "speech_stream")
        total = 0

        async def send_pcm(pcm: np.ndarray) -> None:
            nonlocal total
            data = to_pcm16(pcm)
            if data and await self.sender.binary(data):
                total += len(data)

        async def run_request(text: str, complete: bool) -> str:
            """One engine request; -> "stop" | "length" | "cancelled" | "error"."""
            if u.cancelled:
                return "cancelled"
            request = msgspec.structs.replace(params.request, request_id=new_request_id("stream"),
                                              text=text, text_complete=complete)
            u.request_id = request.request_id  # from here on input.text is fed straight to the engine
            async with aclosing(self.engine.submit(request)) as events:
                async for event in events:
                    if u.cancelled or self.sender.closed:
                        return "cancelled"
                    match event:
                        case AudioChunk(pcm=pcm):
                            stats.audio(len(pcm))
                            await send_pcm(resampler.process(pcm))
                            await asyncio.sleep(0)  # let the loop read client messages (input.cancel) between deltas
                        case Done(reason=reason):
                            return reason
                        case EngineError(message=message, code=code, param=param):
                            await self.send_error(message, code, param)
                            return "error"
            return "error"

        reason = "cancelled"
        try:
            if u.config.split == "none":
                if not self.info.streaming_text:
                    await u.closed.wait()
                reason = await run_request("".join(u.pending), u.input_done)
                u.pending.clear()
            else:
                splitter, reason = TextSplitter(u.config.split), "stop"
                while reason == "stop":
                    piece = await u.text_queue.get()
                    final = piece is None
                    for sentence in splitter.add(piece or "", final):
                        reason = await run_request(sentence, True)
                        if reason != "stop":
                            break
                    if final:
                        break
                if u.cancelled:
                    reason = "cancelled"
            if reason in ("stop", "length"):
                await send_pcm(resampler.flush())
        finally:  # also when the session's teardown cancels this task
            reason = "error" if self.sender.stalled else reason
            stats.end("ok" if reason in ("stop", "length") else reason, self.info.sample_rate)
        await self.sender.json({"type": "audio.done", "utterance_index": u.index, "total_bytes": total,
                                "reason": reason})


async def speech_stream_endpoint(websocket: WebSocket) -> None:
    """`WS /v1/audio/speech/stream`; auth is the API-key middleware's job, before this runs."""
    state = websocket.app.state.streamvox
    if state.engine.info is None or not state.engine.is_ready:
        await websocket.close(1013, "the speech engine is not ready")
        return
    await websocket.accept(subprotocol=accepted_subprotocol(websocket))
    session = SpeechStreamSession(websocket, state.engine, state.metrics)
    await session.sender.serve(session.run())

"""`WS /v1/audio/speech/stream`: incremental text in (e.g. an LLM token stream), PCM audio out.

Client JSON text frames: `session.config`, `input.text`, `input.done`,
`input.cancel`, `session.close`. Server: `audio.start`, binary frames of s16le
mono PCM deltas, `audio.done`, `error`; with `word_timestamps` in `session.config`,
`audio.timestamps` events (after the audio they cover; seconds from the utterance's
first sample, characters into its whole text) and the whole alignment in `audio.done`. The first `input.text` after an
utterance's `input.done` (or `input.cancel`) opens the next utterance;
utterances are spoken one after another, each with its own engine requests
and byte count. Every utterance gets exactly one `audio.start` and
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
from starlette.websockets import WebSocket

from streamvox.audio.formats import to_pcm16
from streamvox.contract import ModelInfo, SpeechRequest, WordTimings
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.server.audio_out import AudioOut, SpeechStats
from streamvox.server.errors import APIError
from streamvox.server.metrics import Metrics
from streamvox.server.speech_params import SETTINGS_FIELDS, check_model, parse_speech_settings, reject_unknown
from streamvox.server.websocket import Sender, accept_when_ready, close_when_idle, decode_json_event
from streamvox.server.word_timestamps import UtteranceTimings
from streamvox.settings import MediaPolicy, ServerSettings
from streamvox.text_split import TextSplitter

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 15 * 1024 * 1024
MAX_TEXT_MESSAGE_CHARS = 65536
MAX_UTTERANCE_CHARS = 200_000
MAX_PENDING_UTTERANCES = 8
TEXT_SPLIT_MODES = ("auto", "none", "sentence", "clause")
_CONFIG_FIELDS = SETTINGS_FIELDS | {"type", "event_id", "text_split", "response_format"}




@dataclass
class StreamConfig:
    request: SpeechRequest  # a template (voice, language, speed, rate, extensions); id and text come per request
    split: str  # "none" | "sentence" | "clause" (resolved from "auto")


def parse_config(event: dict, info: ModelInfo, policy: MediaPolicy) -> StreamConfig:
    """A `session.config` event (or `{}` for the defaults) -> how to speak; `APIError` names a bad field.
    Blocking when it carries `ref_audio` (see `parse_speech_settings`)."""
    if event.get("response_format", "pcm") != "pcm":
        raise APIError(400, "'response_format' must be 'pcm' (s16le mono in binary frames).", "response_format")
    split = event.get("text_split", "auto")
    if split not in TEXT_SPLIT_MODES:
        raise APIError(400, f"'text_split' must be one of {', '.join(TEXT_SPLIT_MODES)}.", "text_split")
    if split == "auto":
        split = "none" if info.streaming_text else "sentence"
    reject_unknown(event, _CONFIG_FIELDS)
    check_model(event, info)
    return StreamConfig(parse_speech_settings(event, info, policy), split)


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
    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics,
                 settings: ServerSettings) -> None:
        self.websocket = websocket
        self.engine = engine
        self.info = engine.info
        self.metrics = metrics
        self.media = settings.media
        self.idle_timeout_s = settings.env.speech_stream_idle_timeout_s
        self.sender = Sender(websocket, engine.max_buffered_audio_s)
        self.config: StreamConfig | None = None
        self.open: Utterance | None = None  # taking input.text now
        self.active: Utterance | None = None  # being spoken now
        self.queue: asyncio.Queue[Utterance | None] = asyncio.Queue()
        self.waiting: list[Utterance] = []  # queued, not started
        self.next_index = 0
        self.last_activity = time.monotonic()
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

        async def before_idle_close(error: APIError) -> None:
            """The error, then every utterance's audio.done (cancelled): each gets its done, as always."""
            await self.send_error(error.message, error.code, error.param)
            await self.input_cancel({})
            self.queue.put_nowait(None)
            await worker

        watchdog = asyncio.create_task(close_when_idle(self.sender, self.idle_timeout_s, self._idle_since,
                                                       before_idle_close))
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
                        raise APIError(400, f"Unknown message type '{event['type']}'.", "type", "unknown_event_type")
                    await handler(event)
                except APIError as error:
                    await self.send_error(error.message, error.code, error.param)
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

    def _idle_since(self) -> float | None:
        """None while an utterance with complete input is being spoken (one still taking input waits on the
        client)."""
        if self.active is not None and (self.active.input_done or self.active.cancelled):
            return None
        return self.last_activity

    # client messages

    async def session_config(self, event: dict) -> None:
        if self.open is not None:
            raise APIError(400, "session.config may only be sent between utterances; send input.done or "
                                "input.cancel first.", code="utterance_open")
        if isinstance(event.get("ref_audio"), str):  # decoding reference audio is compute: off the loop
            self.config = await asyncio.to_thread(parse_config, event, self.info, self.media)
        else:
            self.config = parse_config(event, self.info, self.media)

    async def input_text(self, event: dict) -> None:
        text = event.get("text")
        if not isinstance(text, str):
            raise APIError(400, "'text' must be a string.", "text")
        if len(text) > MAX_TEXT_MESSAGE_CHARS:
            raise APIError(400, f"An input.text carries at most {MAX_TEXT_MESSAGE_CHARS} characters.", "text",
                           "text_too_long")
        u = self.open
        if u is None:
            if len(self.waiting) + (self.active is not None) >= MAX_PENDING_UTTERANCES:
                raise APIError(400, f"At most {MAX_PENDING_UTTERANCES} utterances may wait or run at once; the "
                                    "text was dropped.", code="too_many_utterances")
            if self.config is None:
                self.config = parse_config({}, self.info, self.media)
            u = Utterance(self.next_index, self.config)
            self.next_index += 1
            self.open = u
            self.waiting.append(u)
            self.queue.put_nowait(u)
        if u.chars + len(text) > MAX_UTTERANCE_CHARS:
            raise APIError(400, f"An utterance holds at most {MAX_UTTERANCE_CHARS} characters; the text was "
                                "dropped.", "text", "utterance_too_long")
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
            raise APIError(400, "input.done without an open utterance; send input.text first.",
                           code="no_open_utterance")
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
        template = u.config.request
        await self.sender.json({"type": "audio.start", "utterance_index": u.index, "format": "pcm",
                                "sample_rate": template.sample_rate, "channels": 1})
        stats = SpeechStats(self.metrics, "speech_stream")  # one utterance, however many requests speak it
        total = 0
        timed = UtteranceTimings(template.sample_rate) if template.word_timestamps else None

        async def run_request(text: str, complete: bool) -> str:
            """One engine request; -> "stop" | "length" | "cancelled" | "error"."""
            nonlocal total
            if u.cancelled:
                return "cancelled"
            request = msgspec.structs.replace(template, request_id=new_request_id("stream"), text=text,
                                              text_complete=complete)
            async with AudioOut(self.engine, request, stats, report=False) as out:
                u.request_id = request.request_id  # registered: from here on input.text goes straight to it
                if u.cancelled:
                    return "cancelled"
                if not complete:
                    self._catch_up(u)
                if timed is not None and (skipped := timed.start_request(
                        text if u.config.split != "none" else None)) is not None:
                    await self._send_timings(u, skipped)
                async with aclosing(out.stream() if timed is not None else out.deltas()) as deltas:
                    async for pcm in deltas:
                        if u.cancelled or self.sender.closed:
                            return "cancelled"
                        if isinstance(pcm, WordTimings):
                            await self._send_timings(u, timed.place(pcm))
                            continue
                        if timed is not None:
                            timed.audio(len(pcm))
                        data = to_pcm16(pcm)
                        if data and await self.sender.binary(data):
                            total += len(data)
            if u.cancelled or self.sender.closed:
                return "cancelled"
            if (error := out.result.error) is not None:
                await self.send_error(error.message, error.code, error.param)
                return "error"
            return out.result.done.reason if out.result.done is not None else "cancelled"

        reason = "cancelled"
        try:
            if u.config.split == "none":
                if not self.info.streaming_text:
                    await u.closed.wait()
                text, complete = "".join(u.pending), u.input_done
                u.pending.clear()
                reason = await run_request(text, complete)
            else:
                splitter, reason = TextSplitter(u.config.split), "stop"
                while reason == "stop":
                    piece = await u.text_queue.get()
                    final = piece is None
                    if timed is not None and piece:
                        timed.add_text(piece)
                    for sentence in splitter.add(piece or "", final):
                        reason = await run_request(sentence, True)
                        if reason != "stop":
                            break
                    if final:
                        if reason == "stop" and timed is not None and (rest := timed.rest()) is not None:
                            await self._send_timings(u, rest)
                        break
                if u.cancelled:
                    reason = "cancelled"
        except asyncio.CancelledError:  # the session's teardown (the client left)
            reason = "cancelled"
            raise
        finally:
            reason = "error" if self.sender.stalled else reason
            stats.end("ok" if reason in ("stop", "length") else reason, template.sample_rate)
        done = {"type": "audio.done", "utterance_index": u.index, "total_bytes": total, "reason": reason}
        if timed is not None:
            done["timestamps"] = timed.whole().to_json()
        await self.sender.json(done)

    async def _send_timings(self, u: Utterance, timings: WordTimings) -> None:
        await self.sender.json({"type": "audio.timestamps", "utterance_index": u.index, **timings.to_json()})

    def _catch_up(self, u: Utterance) -> None:
        """Hand the engine what came for `u` while its request was being registered (queued in `u.pending`)."""
        if u.pending:
            self.engine.feed_text(u.request_id, "".join(u.pending))
            u.pending.clear()
        if u.input_done:
            self.engine.end_input(u.request_id)


async def speech_stream_endpoint(websocket: WebSocket) -> None:
    """`WS /v1/audio/speech/stream`; auth is the API-key middleware's job, before this runs."""
    if not await accept_when_ready(websocket):
        return
    state = websocket.app.state.streamvox
    session = SpeechStreamSession(websocket, state.engine, state.metrics, state.settings)
    await session.sender.serve(session.run())

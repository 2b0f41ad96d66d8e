"""The engine front end that lives on the server's event loop.

`AsyncEngine` submits requests to the engine core (a process of its own, kept
running by `supervisor.EngineSupervisor`) and gives each request a queue of
events (`events.py`); nothing here waits for compute. It also keeps the
cloned voices, and registers them with every core that starts.

Consumers take turns (`LoopTurns`). The core sends the audio of many
requests in one message, and what a consumer does per delta (encoding,
writing) costs the loop about a millisecond per second of audio; waking
every consumer at once would stall the loop for tens of milliseconds under
a few hundred streams. So each delta a consumer takes is one turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable

import msgspec
import numpy as np
import zmq

from streamvox.contract import ModelInfo, SpeechRequest
from streamvox.engine import messages as m
from streamvox.engine.events import (
    SLOW_CONSUMER,
    AudioChunk,
    Done,
    EngineError,
    EngineEvent,
    EngineUnavailable,
    VoiceRefused,
    Words,
)
from streamvox.engine.loop_turns import LoopTurns
from streamvox.engine.supervisor import EngineSupervisor

log = logging.getLogger(__name__)

_MAX_DELTA_S = 0.5  # queued audio merged into one delta: under load, fewer and larger deltas
# Loop time of one consumer turn (one delta: resample, s16le, base64/JSON, write). Measured on the 2-core
# benchmark machine under 200 SSE streams: median 0.7 ms per turn, nearly flat in the delta's length (~1.4 s).
_TURN_COST_MS = 0.75


class VoiceSample(msgspec.Struct):
    """A cloned voice as the front end keeps it: reference audio, its transcript, and metadata."""

    name: str
    pcm: np.ndarray  # mono float32
    sample_rate: int
    ref_text: str | None = None
    meta: dict = {}  # what GET /v1/audio/voices shows (created_at, duration_s, ...)


class _Stream:
    """Front-end state of one request: its queued events, its consumer's turn, buffered audio."""

    __slots__ = ("events", "turn", "turn_queued", "buffered_samples", "rate")

    def __init__(self, rate: int) -> None:
        self.events: deque[EngineEvent] = deque()
        self.turn: asyncio.Future | None = None  # the consumer waits for it
        self.turn_queued = False
        self.buffered_samples = 0
        self.rate = rate  # of its audio


class AsyncEngine:
    """Submit requests to the engine core and iterate over their events."""

    def __init__(
        self,
        model: str,
        *,
        model_options: dict | None = None,
        restart_on_crash: bool = True,
        max_buffered_audio_s: float = 300.0,
        start_timeout_s: float = 600.0,
        restart_backoff_initial_s: float = 0.5,
        restart_backoff_max_s: float = 30.0,
        stable_after_s: float = 30.0,
    ) -> None:
        self.max_buffered_audio_s = max_buffered_audio_s
        self.info: ModelInfo | None = None
        self._streams: dict[str, _Stream] = {}
        self.turns = LoopTurns()  # shared with the routes: new requests take a turn too
        self._supervisor = EngineSupervisor(
            model, model_options or {}, on_message=self._dispatch, on_exit=self._on_core_exit,
            restart_on_crash=restart_on_crash, start_timeout_s=start_timeout_s,
            restart_backoff_initial_s=restart_backoff_initial_s, restart_backoff_max_s=restart_backoff_max_s,
            stable_after_s=stable_after_s)
        # Cloned voices. `voice_loader` (blocking; run in a thread) returns the persisted voices: they are
        # registered with every core that starts, before it is marked ready, so a restarted engine knows them.
        self.voice_loader: Callable[[], list[VoiceSample]] | None = None
        self.voices: dict[str, dict] = {}  # registered in the running core: name -> metadata
        self.base_info: ModelInfo | None = None  # as the core reported it, without cloned voices
        self._voice_waiters: dict[int, asyncio.Future] = {}
        self._voice_tokens = itertools.count(1)
        self._restore_task: asyncio.Task | None = None

    # lifecycle (the supervisor's, seen from here)

    @property
    def is_ready(self) -> bool:
        return self._supervisor.is_ready

    @property
    def active_requests(self) -> int:
        return len(self._streams)

    @property
    def core_pid(self) -> int | None:
        return self._supervisor.pid

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts

    @property
    def consecutive_failures(self) -> int:
        """Cores that failed in a row, each soon after it started (the restart backoff grows with it)."""
        return self._supervisor.consecutive_failures

    @property
    def restart_in_s(self) -> float | None:
        """Seconds until the next restart attempt while backing off, else None."""
        return self._supervisor.restart_in_s

    @property
    def on_core_exit(self) -> Callable[[int | None], None] | None:
        """Called with the exit code when a core that was ready exits, instead of restarting it."""
        return self._supervisor.on_core_exit

    @on_core_exit.setter
    def on_core_exit(self, callback: Callable[[int | None], None] | None) -> None:
        self._supervisor.on_core_exit = callback

    async def start(self) -> None:
        """Start the core process and wait until its model is loaded."""
        await self._supervisor.start()

    async def wait_ready(self) -> None:
        """Wait for the core's model to load; fail at once if the core exits first."""
        await self._supervisor.wait_ready()

    async def shutdown(self) -> None:
        await self._supervisor.shutdown()
        self._fail_all(EngineError("The server is shutting down.", "engine_unavailable"))
        self._fail_voice_waiters("The server is shutting down.")
        self._supervisor.close()

    def _on_core_exit(self) -> None:
        self._fail_all(EngineError("The speech engine stopped; the request was aborted.", "engine_unavailable"))
        self._fail_voice_waiters("The speech engine stopped.")

    def _fail_all(self, error: EngineError) -> None:
        for stream in self._streams.values():
            self._post(stream, error)
        self._streams.clear()

    # cloned voices

    async def add_voice(self, sample: VoiceSample) -> None:
        """Register a cloned voice with the core; `VoiceRefused` if the model refuses it,
        `EngineUnavailable` if the core is not running (or stops meanwhile)."""
        if not self.is_ready:
            raise EngineUnavailable("The speech engine is not available.")
        await self._register_voice(sample)

    def remove_voice(self, name: str) -> None:
        self.voices.pop(name, None)
        self._send(m.RemoveVoice(name))
        self._publish_info()

    async def _register_voice(self, sample: VoiceSample) -> None:
        token = next(self._voice_tokens)
        future = asyncio.get_running_loop().create_future()
        self._voice_waiters[token] = future
        pcm = np.ascontiguousarray(sample.pcm, dtype="<f4").tobytes()
        self._send(m.AddVoice(token, sample.name, pcm, sample.sample_rate, sample.ref_text))
        try:
            result: m.VoiceResult = await future
        finally:
            self._voice_waiters.pop(token, None)
        if result.message is not None:
            raise VoiceRefused(result.message, result.code, result.param)
        self.voices[sample.name] = sample.meta
        self._publish_info()

    def _publish_info(self) -> None:
        """`info` with the cloned voices appended to the built-in ones (what every route validates)."""
        base = self.base_info
        if base is None:
            return
        extra = sorted(name for name in self.voices if name not in base.voices)
        self.info = msgspec.structs.replace(base, voices=[*base.voices, *extra]) if extra else base

    def _fail_voice_waiters(self, message: str) -> None:
        for future in self._voice_waiters.values():
            if not future.done():
                future.set_exception(EngineUnavailable(message))
        self._voice_waiters.clear()

    async def _restore_voices(self, process: multiprocessing.process.BaseProcess) -> None:
        """Register the persisted voices with a core that just loaded, then mark it ready."""
        try:
            samples = await asyncio.to_thread(self.voice_loader) if self.voice_loader is not None else []
        except Exception:  # a broken voices directory must not keep the engine down
            log.exception("could not load the stored voices")
            samples = []
        for sample in samples:
            if process is not self._supervisor.process:
                return
            try:
                await self._register_voice(sample)
            except VoiceRefused as refused:
                log.warning("stored voice %r was refused by the model: %s", sample.name, refused.message)
            except EngineUnavailable:
                return
        if process is self._supervisor.process and process.is_alive():
            if samples:
                log.info("restored %d of %d stored voices", len(self.voices), len(samples))
            self._supervisor.mark_ready(self.info.name)

    # requests

    async def submit(self, request: SpeechRequest) -> AsyncIterator[EngineEvent]:
        """Yield the request's events until `Done` or `EngineError`.

        Leaving the iteration early (client disconnect, task cancelled) cancels the
        request in the core, which frees its state within one engine step.
        """
        if not self.is_ready:
            yield EngineError("The speech engine is not available.", "engine_unavailable")
            return
        stream = _Stream(request.sample_rate or self.info.sample_rate)
        request_id = request.request_id
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id}")
        self._streams[request_id] = stream
        self._send(m.AddRequest(request))
        finished = False
        events = stream.events
        loop = asyncio.get_running_loop()
        try:
            while not finished:
                stream.turn, stream.turn_queued = loop.create_future(), False
                if events:
                    self._queue_turn(stream)
                await stream.turn
                event = events.popleft()
                if isinstance(event, AudioChunk):
                    # Merge the audio that queued up meanwhile, up to a cap: a stalled client's backlog is not
                    # copied (and written to its transport) in one piece, and one turn stays short.
                    parts, merged, cap = [event.pcm], len(event.pcm), int(_MAX_DELTA_S * stream.rate)
                    while merged < cap and events and isinstance(events[0], AudioChunk):
                        parts.append(events.popleft().pcm)
                        merged += len(parts[-1])
                    event = AudioChunk(np.concatenate(parts)) if len(parts) > 1 else event
                    stream.buffered_samples -= len(event.pcm)
                elif not isinstance(event, Words):
                    finished = True
                yield event
        finally:
            if self._streams.get(request_id) is stream:
                del self._streams[request_id]
                if not finished:
                    self._send(m.Cancel(request_id))

    def feed_text(self, request_id: str, text: str) -> None:
        if request_id in self._streams:
            self._send(m.FeedText(request_id, text))

    def end_input(self, request_id: str) -> None:
        if request_id in self._streams:
            self._send(m.EndInput(request_id))

    def cancel(self, request_id: str, error: EngineError | None = None) -> None:
        """Stop a request now; its iterator ends (with `error` if given, else silently with a cancel)."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self._send(m.Cancel(request_id))
        self._post(stream, error or Done("cancelled", 0, 0))

    def _post(self, stream: _Stream, event: EngineEvent) -> None:
        stream.events.append(event)
        if stream.turn is not None and not stream.turn_queued:
            self._queue_turn(stream)

    def _queue_turn(self, stream: _Stream) -> None:
        stream.turn_queued = True
        self.turns.queue(stream.turn, _TURN_COST_MS)

    def _send(self, message: m.CoreInput) -> None:
        self._supervisor.send(message)

    def _dispatch(self, frames: list[zmq.Frame]) -> None:
        message = m.output_decoder.decode(frames[0].buffer)
        match message:
            case m.Outputs(audio=audio, ended=ended, words=words):
                for request_id, frame in zip(audio, frames[1:], strict=True):
                    self._audio(request_id, frame)
                for request_words in words:
                    if (stream := self._streams.get(request_words.request_id)) is not None:
                        self._post(stream, Words(request_words.timings))
                for end in ended:
                    self._end(end)
            case m.Ready(info=info):
                self.base_info = self.info = info
                self.voices.clear()
                if info.voice_cloning and self.voice_loader is not None:
                    self._restore_task = asyncio.get_running_loop().create_task(
                        self._restore_voices(self._supervisor.process))
                else:
                    self._supervisor.mark_ready(info.name)
            case m.VoiceResult(token=token):
                future = self._voice_waiters.get(token)
                if future is not None and not future.done():
                    future.set_result(message)
            case m.CoreCrashed(message=text):
                log.error("engine core reported a crash: %s", text)

    def _audio(self, request_id: str, frame: zmq.Frame) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        pcm = np.frombuffer(frame.buffer, dtype="<f4")
        stream.buffered_samples += len(pcm)
        self._post(stream, AudioChunk(pcm))
        if stream.buffered_samples > self.max_buffered_audio_s * stream.rate:
            self.cancel(request_id, SLOW_CONSUMER)

    def _end(self, message: m.Finished | m.Failed) -> None:
        stream = self._streams.pop(message.request_id, None)
        if stream is None:
            return
        if isinstance(message, m.Finished):
            self._post(stream, Done(message.reason, message.input_tokens, message.output_tokens))
        else:
            self._post(stream, EngineError(message.message, message.code, message.param))


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"



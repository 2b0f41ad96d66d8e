"""The engine front end that lives on the server's event loop.

`AsyncEngine` starts the engine core in its own process and talks to it over
ZMQ (msgspec headers, raw PCM frames). Each request gets a queue of events;
nothing here waits for compute.

Consumers take turns (`LoopTurns`). The core sends the audio of many
requests in one message, and what a consumer does per delta (resampling,
encoding, writing) costs the loop about a millisecond per second of audio;
waking every consumer at once would stall the loop for tens of milliseconds
under a few hundred streams. So each delta a consumer takes is one turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable

import msgspec
import numpy as np
import zmq

from streamvox.contract import ModelInfo, SpeechRequest
from streamvox.engine import messages as m
from streamvox.engine.core import run_engine_core
from streamvox.engine.loop_turns import LoopTurns

log = logging.getLogger(__name__)

_MAX_MESSAGES_PER_WAKEUP = 256
_MAX_DELTA_S = 0.5  # queued audio merged into one delta: under load, fewer and larger deltas
# Loop time of one consumer turn (one delta: resample, s16le, base64/JSON, write). Measured on the 2-core
# benchmark machine under 200 SSE streams: median 0.7 ms per turn, nearly flat in the delta's length (~1.4 s).
_TURN_COST_MS = 0.75


class AudioChunk(msgspec.Struct):
    """New samples (mono float32 at the request's `sample_rate`, by default the model's)."""

    pcm: np.ndarray


class Done(msgspec.Struct):
    reason: str  # "stop" | "length"
    input_tokens: int
    output_tokens: int


class EngineError(msgspec.Struct):
    message: str
    code: str
    param: str | None = None

    @property
    def is_request_error(self) -> bool:
        """True when the request itself was at fault (a 400), not the engine."""
        return self.code not in ("engine_unavailable", "slow_consumer")


EngineEvent = AudioChunk | Done | EngineError

SLOW_CONSUMER = EngineError("The client read audio too slowly; the request was cancelled.", "slow_consumer")


class EngineUnavailable(RuntimeError):
    pass


class VoiceSample(msgspec.Struct):
    """A cloned voice as the front end keeps it: reference audio, its transcript, and metadata."""

    name: str
    pcm: np.ndarray  # mono float32
    sample_rate: int
    ref_text: str | None = None
    meta: dict = {}  # what GET /v1/audio/voices shows (created_at, duration_s, ...)


class VoiceRefused(Exception):
    """The model refused a voice (e.g. its audio could not be analysed)."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


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
        self.model = model
        self.model_options = model_options or {}  # keyword arguments of `streamvox.models.load_runner`
        self.restart_on_crash = restart_on_crash
        self.max_buffered_audio_s = max_buffered_audio_s
        self.start_timeout_s = start_timeout_s
        self.info: ModelInfo | None = None
        self.on_core_exit: Callable[[int | None], None] | None = None  # e.g. exit the server
        self._streams: dict[str, _Stream] = {}
        self.turns = LoopTurns()  # shared with the routes: new requests take a turn too
        self._process: multiprocessing.process.BaseProcess | None = None
        self._ready: asyncio.Event = asyncio.Event()
        self._closing = False
        self._ipc_dir = tempfile.mkdtemp(prefix="streamvox-")
        self._context = zmq.Context()
        self._outbox: zmq.Socket | None = None
        self._inbox: zmq.Socket | None = None
        self.restarts = 0
        # Restart backoff: the first restart after a core that ran for `stable_after_s` is immediate; each
        # further quick failure doubles the wait (initial, 2x, 4x, ... up to the max), so an engine that
        # fails at start does not spin.
        self.restart_backoff_initial_s = restart_backoff_initial_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.stable_after_s = stable_after_s
        self.consecutive_failures = 0
        self.next_restart_at: float | None = None  # monotonic time of the pending restart, while backing off
        self._spawned_at = 0.0
        self._ever_ready = False
        self._core_exited: asyncio.Event = asyncio.Event()
        # Cloned voices. `voice_loader` (blocking; run in a thread) returns the persisted voices: they are
        # registered with every core that starts, before it is marked ready, so a restarted engine knows them.
        self.voice_loader: Callable[[], list[VoiceSample]] | None = None
        self.voices: dict[str, dict] = {}  # registered in the running core: name -> metadata
        self.base_info: ModelInfo | None = None  # as the core reported it, without cloned voices
        self._voice_waiters: dict[int, asyncio.Future] = {}
        self._voice_tokens = itertools.count(1)
        self._restore_task: asyncio.Task | None = None

    # lifecycle

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self._process is not None and self._process.is_alive()

    @property
    def active_requests(self) -> int:
        return len(self._streams)

    @property
    def core_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the core process and wait until its model is loaded."""
        await self._spawn()
        await self.wait_ready()

    async def wait_ready(self) -> None:
        """Wait for the core's model to load; fail at once if the core exits first."""
        ready = asyncio.ensure_future(self._ready.wait())
        exited = asyncio.ensure_future(self._core_exited.wait())
        try:
            await asyncio.wait({ready, exited}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
        if self._ready.is_set():
            return
        if self._core_exited.is_set():
            raise EngineUnavailable("engine core exited before its model was ready; its log above says why")
        raise EngineUnavailable(f"engine core did not become ready in {self.start_timeout_s} s")

    @property
    def restart_in_s(self) -> float | None:
        """Seconds until the next restart attempt while backing off, else None."""
        if self.next_restart_at is None:
            return None
        return max(0.0, self.next_restart_at - time.monotonic())

    async def _spawn(self) -> None:
        tag = uuid.uuid4().hex[:8]
        input_address = f"ipc://{self._ipc_dir}/in-{tag}"
        output_address = f"ipc://{self._ipc_dir}/out-{tag}"
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.bind(input_address)
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(output_address)
        self._ready.clear()
        self._core_exited.clear()
        self._spawned_at = time.monotonic()
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(
            target=run_engine_core, args=(self.model, self.model_options, input_address, output_address), daemon=True
        )
        await asyncio.to_thread(self._process.start)  # spawning pickles and forks: keep it off the loop
        loop = asyncio.get_running_loop()
        loop.add_reader(self._process.sentinel, self._on_process_exit, self._process)
        loop.add_reader(self._inbox.getsockopt(zmq.FD), self._on_inbox_readable)
        self._on_inbox_readable()  # messages may already be queued: the FD only signals new edges

    def _on_process_exit(self, process: multiprocessing.process.BaseProcess) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        if process is not self._process:
            return
        self._ready.clear()
        self._core_exited.set()
        self._fail_all(EngineError("The speech engine stopped; the request was aborted.", "engine_unavailable"))
        self._fail_voice_waiters("The speech engine stopped.")
        self._close_sockets()
        asyncio.create_task(self._after_exit(process))

    async def _after_exit(self, process: multiprocessing.process.BaseProcess) -> None:
        await asyncio.to_thread(process.join)
        if self._closing:
            return
        log.error("engine core exited with code %s", process.exitcode)
        if not self._ever_ready:
            return  # the first start failed: `wait_ready` reports it; restarting would only loop
        if self.on_core_exit is not None:
            self.on_core_exit(process.exitcode)
        elif self.restart_on_crash:
            if time.monotonic() - self._spawned_at >= self.stable_after_s:
                self.consecutive_failures = 0
            delay = 0.0 if self.consecutive_failures == 0 else min(
                self.restart_backoff_initial_s * 2 ** (self.consecutive_failures - 1), self.restart_backoff_max_s)
            self.consecutive_failures += 1
            if delay > 0:
                log.error("engine core failed %d times in a row; restarting in %.1f s",
                          self.consecutive_failures, delay)
                self.next_restart_at = time.monotonic() + delay
                try:
                    await asyncio.sleep(delay)
                finally:
                    self.next_restart_at = None
                if self._closing:
                    return
            self.restarts += 1
            await self._spawn()

    def _fail_all(self, error: EngineError) -> None:
        for stream in self._streams.values():
            self._post(stream, error)
        self._streams.clear()

    def _close_sockets(self) -> None:
        if self._inbox is not None:
            asyncio.get_running_loop().remove_reader(self._inbox.getsockopt(zmq.FD))
        for socket in (self._outbox, self._inbox):
            if socket is not None:
                socket.close(linger=0)
        self._outbox = self._inbox = None

    async def shutdown(self) -> None:
        self._closing = True
        process = self._process
        if process is not None and process.is_alive():
            self._send(m.Shutdown())
            await asyncio.to_thread(process.join, 5)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5)
        if process is not None and process.exitcode is not None:
            try:
                asyncio.get_running_loop().remove_reader(process.sentinel)
            except (ValueError, OSError):
                pass
        self._fail_all(EngineError("The server is shutting down.", "engine_unavailable"))
        self._fail_voice_waiters("The server is shutting down.")
        self._close_sockets()
        self._context.term()

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
            if process is not self._process:
                return
            try:
                await self._register_voice(sample)
            except VoiceRefused as refused:
                log.warning("stored voice %r was refused by the model: %s", sample.name, refused.message)
            except EngineUnavailable:
                return
        if process is self._process and process.is_alive():
            if samples:
                log.info("restored %d of %d stored voices", len(self.voices), len(samples))
            self._mark_ready()

    def _mark_ready(self) -> None:
        self._ever_ready = True
        self._ready.set()
        log.info("engine core ready: model %s (pid %s)", self.info.name, self._process.pid)

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
                else:
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
        if self._outbox is not None:
            self._outbox.send(m.input_encoder.encode(message))

    def _on_inbox_readable(self) -> None:
        """Drain a bounded batch of core messages; reschedule while more are queued.

        The ZMQ socket's file descriptor is edge-triggered, so after a batch we
        look at ZMQ_EVENTS ourselves rather than wait for the next edge.
        """
        inbox = self._inbox
        if inbox is None:
            return
        for _ in range(_MAX_MESSAGES_PER_WAKEUP):
            try:
                frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._dispatch(frames)
        if inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            asyncio.get_running_loop().call_soon(self._on_inbox_readable)

    def _dispatch(self, frames: list[zmq.Frame]) -> None:
        message = m.output_decoder.decode(frames[0].buffer)
        match message:
            case m.Outputs(audio=audio, ended=ended):
                for request_id, frame in zip(audio, frames[1:], strict=True):
                    self._audio(request_id, frame)
                for end in ended:
                    self._end(end)
            case m.AudioDelta(request_id=request_id):
                self._audio(request_id, frames[1])
            case m.Finished() | m.Failed():
                self._end(message)
            case m.Ready(info=info):
                self.base_info = self.info = info
                self.voices.clear()
                if info.voice_cloning and self.voice_loader is not None:
                    self._restore_task = asyncio.get_running_loop().create_task(self._restore_voices(self._process))
                else:
                    self._mark_ready()
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



"""The one loop from an engine request's events to audio for the wire.

Every route that speaks (speech files, audio and SSE streams, the speech-stream
WebSocket, Realtime responses and agent turns) runs its engine request through
`AudioOut`: it yields the request's audio deltas (float32 at the request's
output rate: the engine core resamples), keeps the request's metrics, and
records how the request ended in `result`. A request with `word_timestamps`
also gets its `WordTimings`: interleaved after the audio they cover from
`stream()`, and all of them in `result.timings()` once it ended. A consumer that stops early just
leaves the loop; the request is then cancelled in the engine and counts as
cancelled, unless the consumer called `fail` first. A consumer that reports
to the metrics itself (several requests as one utterance, or an HTTP status)
passes `report=False`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from streamvox.contract import SpeechRequest, WordTimings
from streamvox.engine.client import AsyncEngine, AudioChunk, Done, EngineError, EngineEvent
from streamvox.engine.events import Words
from streamvox.server.metrics import Metrics


class SpeechStats:
    """Timing of one request, reported to the metrics when it ends."""

    def __init__(self, metrics: Metrics, route: str) -> None:
        self.metrics = metrics
        self.route = route
        self.start = time.perf_counter()
        self.first_audio: float | None = None
        self.samples = 0

    def audio(self, samples: int) -> None:
        if self.first_audio is None and samples:
            self.first_audio = time.perf_counter()
            self.metrics.ttfp.observe(self.first_audio - self.start)
        self.samples += samples

    def end(self, status: str, sample_rate: int) -> None:
        """`status`: "ok", "cancelled" or "error" (or an HTTP status for a refused request)."""
        self.metrics.requests.labels(self.route, status).inc()
        if status == "ok" and self.samples:
            seconds = self.samples / sample_rate
            self.metrics.audio_seconds.inc(seconds)
            self.metrics.rtf.observe((time.perf_counter() - self.start) / seconds)


@dataclass
class SpeechResult:
    """How a request ended. `status`: "completed" (the model stopped), "incomplete" (it reached its length
    limit), "failed" (`error` says why) or "cancelled" (the engine or the consumer stopped it)."""

    status: str = "cancelled"
    done: Done | None = None
    error: EngineError | None = None
    deltas: int = 0  # audio deltas handed to the consumer
    words: list[WordTimings] = field(default_factory=list)  # received so far, in order

    def timings(self) -> WordTimings | None:
        """Every word timing received (None when the request did not ask for them or got none)."""
        return WordTimings.join(self.words) if self.words else None

    @property
    def metrics_status(self) -> str:
        return {"completed": "ok", "incomplete": "ok", "failed": "error"}.get(self.status, "cancelled")


class AudioOut:
    """One engine request, from submission to its end; use as an async context manager.

    `open()` registers the request with the engine (text may be fed from then on); `first_error()` waits
    for the first event and returns it if the request failed before any audio (a route can still answer
    with an error status); `deltas()` yields the audio, `stream()` the audio and the word timings.
    `stats` None: no metrics (the `speak` command).
    """

    def __init__(self, engine: AsyncEngine, request: SpeechRequest, stats: SpeechStats | None, *,
                 report: bool = True) -> None:
        self.request = request
        self.stats = stats
        self.report = report  # close() reports the request to the metrics
        self.result = SpeechResult()
        self.sample_rate = request.sample_rate or engine.info.sample_rate
        self._events = engine.submit(request)
        self._first: asyncio.Future | None = None
        self._closed = False

    async def __aenter__(self) -> AudioOut:
        await self.open()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def open(self) -> None:
        if self._first is None:
            self._first = asyncio.ensure_future(anext(self._events, None))
            await asyncio.sleep(0)  # the submission runs now: the engine knows the request before any feed_text

    async def first_error(self) -> EngineError | None:
        await self.open()
        event = await self._first
        return event if isinstance(event, EngineError) else None

    def deltas(self) -> AsyncIterator[np.ndarray]:
        """The request's audio; between deltas the loop runs other tasks (a client's cancel is read).

        Word timings (if the request asked for them) are kept in `result` only."""
        return self._output(False)

    def stream(self) -> AsyncIterator[np.ndarray | WordTimings]:
        """The request's audio deltas and its word timings, each timing after the audio it covers."""
        return self._output(True)

    async def _output(self, with_words: bool) -> AsyncIterator[np.ndarray | WordTimings]:
        await self.open()
        result = self.result
        event: EngineEvent | None = await self._first
        while isinstance(event, AudioChunk | Words):
            if isinstance(event, Words):
                result.words.append(event.timings)
                if with_words:
                    yield event.timings
            else:
                if self.stats is not None:
                    self.stats.audio(len(event.pcm))
                result.deltas += 1
                yield event.pcm
                await asyncio.sleep(0)
            event = await anext(self._events, None)
        match event:
            case Done(reason="cancelled") | None:
                pass
            case Done() as done:
                result.done = done
                result.status = "completed" if done.reason == "stop" else "incomplete"
            case EngineError() as error:
                result.error = error
                result.status = "failed"

    def fail(self, error: EngineError) -> None:
        """The consumer ends the request with `error` (for example a client too slow to read)."""
        self.result.error = error
        self.result.status = "failed"

    async def close(self) -> None:
        """Cancel the request in the engine unless it ended, and report it to the metrics (once, if `report`)."""
        if self._closed or self._first is None:
            return
        self._closed = True
        if not self._first.done():
            self._first.cancel()
            await asyncio.wait([self._first])
        await self._events.aclose()
        if self.report and self.stats is not None:
            self.stats.end(self.result.metrics_status, self.sample_rate)

"""Word timings for a model that cannot time its own words: its audio, aligned with its text.

`AligningRunner` wraps a model's runner. Requests that ask for `word_timestamps` have their
audio (as it is sent, untouched and undelayed) and their text kept, and a worker thread aligns
them while they speak: every `STEP_S` seconds of new audio, the audio since the last committed
word's start (at most `_PARTIAL_MAX_S` of it) with the words from there to the end of the text fed
so far (a partial job). Partial jobs keep timings ahead of playback, which runs in real time, so a
request gets at most one every `STEP_S` seconds of wall time too, unless more of its audio waits for
timings than the aligner is trusted with in one job (`WordAligner.longest_job_s`): a request generated
faster than real time needs few, and leaves the device to the model. Words
that two partial alignments in a row agree on, and that end well before the aligned audio does,
are committed: their timings are sent at once (`stable_prefix.py`). The next job starts at the
last committed word, aligned again but not sent again: an aligner's word ends are looser than its
starts, and audio cut at an end that is a little early begins with a sound of no word it is given.
Once a request's audio is complete, a final job aligns the rest at once (the result of a partial job
still running is then dropped), and its timings are sent, then its end. The engine's thread only notes
what a job covers: the worker joins its audio and finds a final job's words, so a request's last audio
leaves the engine without waiting on that work for every request ending in the same step. The jobs of one engine step
reach the worker together; it takes every job waiting when it comes round and aligns them in batches
of up to `_MAX_BATCH` (`align_batch`: one forward of a GPU aligner).
The audio path never waits on alignment: only the request's end does. Audio that cannot be
aligned gets no timings at all (never guessed ones), and the request ends normally; a request
released before its end keeps the timings already sent.
"""

from __future__ import annotations

import logging
import math
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from streamvox.contract import OutputSink, RequestError, Runner, SpeechRequest, WordTimings
from streamvox.models.alignment.stable_prefix import STEP_S, bounded, shifted, stable_count, uncommitted_starts
from streamvox.models.alignment.word_aligner import AlignmentFailed, Spans, WordAligner

log = logging.getLogger(__name__)

# The worker's Python holds the interpreter lock that the engine's thread needs between frame steps, and a
# waiting thread gets it only after the switch interval (5 ms by default: about one frame step of 16 streams
# on an H100).
_SWITCH_INTERVAL_S = 0.001
_WORD = re.compile(r"\S+")
_IDLE_WAIT_S = 0.005  # how long a step waits for an alignment when the model has nothing to do
_MAX_BATCH = 16  # jobs aligned together (the most the GPU aligner replays from a CUDA graph)
_PARTIAL_MAX_S = 8.0  # the most audio a partial job aligns (one attention window of the GPU aligner)
# A partial job takes at most this many words per second of its audio (plus a few): faster than anyone
# speaks, so it holds every word the audio does, but not a long text's far tail.
_MAX_WORDS_PER_S, _SPARE_WORDS = 6, 4


@dataclass
class _Timed:
    text: str
    text_complete: bool
    chunks: list[np.ndarray] = field(default_factory=list)  # the audio from the last committed word's start on
    # (the runner's arrays, or views of them: the sink's arrays are never changed)
    held: int = 0  # samples in `chunks`
    base: int = 0  # where `chunks` start, in samples from the request's first
    committed: int = 0  # words whose timings were sent
    floor: float = 0.0  # where the last of them ends (s): no later word starts before it
    partial_at: int = 0  # samples received when its last partial job was queued
    partial_time: float = 0.0  # and when (the runner's clock)
    busy: bool = False  # one of its jobs is being aligned (two, while a final job follows a partial one)
    final_queued: bool = False  # its final job is queued: a partial job's result is stale
    previous: dict[int, float] = field(default_factory=dict)  # uncommitted word -> start in the last partial
    ended: tuple[str, int, int] | None = None  # its audio is complete: its `finished` arguments


@dataclass
class _Job:
    request_id: str
    timed: _Timed
    committed: int  # the request's words whose timings were sent when it was queued
    first: int  # index of its first word in the request's words (the last committed one, if any)
    words: list[re.Match] | None  # from `first` on; None (a final job): the worker finds them in `text`
    text: str
    floor: float  # where the committed words end (s)
    chunks: list[np.ndarray]  # its audio, joined by the worker: the first `samples` samples of these
    samples: int
    offset: float  # where its audio starts, in seconds from the request's first sample
    end: float  # where it ends
    final: bool


@dataclass
class _Aligned:
    job: _Job
    spans: Spans | None  # None: the job's audio could not be aligned


class AligningRunner:
    """A `Runner` that adds word timings (`ModelInfo.word_timestamps`) to `runner` with `aligner`."""

    def __init__(self, runner: Runner, aligner: WordAligner, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: seconds of wall time, which paces partial jobs (tests play audio in simulated real time)."""
        self.runner = runner
        self._clock = clock
        self.info = msgspec.structs.replace(runner.info, word_timestamps=True)
        self._aligner = aligner
        self._timed: dict[str, _Timed] = {}  # requests that asked for timings, until they end
        self._in_flight = 0  # jobs queued and not yet collected (those of released requests too)
        self._step_jobs: list[_Job] = []  # queued by this step, not yet handed to the worker
        self._jobs: queue.SimpleQueue[list[_Job] | None] = queue.SimpleQueue()  # each step's jobs
        self._results: queue.SimpleQueue[_Aligned] = queue.SimpleQueue()
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        self._worker = threading.Thread(target=self._align_jobs, name="aligner", daemon=True)
        self._worker.start()

    # Runner

    def add(self, request: SpeechRequest) -> None:
        self.runner.add(request)
        if request.word_timestamps:
            self._timed[request.request_id] = _Timed(request.text, request.text_complete, partial_time=self._clock())

    def feed_text(self, request_id: str, text: str) -> None:
        if (timed := self._timed.get(request_id)) is not None:
            timed.text += text
        self.runner.feed_text(request_id, text)

    def end_input(self, request_id: str) -> None:
        if (timed := self._timed.get(request_id)) is not None:
            timed.text_complete = True
        self.runner.end_input(request_id)

    def release(self, request_id: str) -> None:
        self._timed.pop(request_id, None)  # its jobs' results, when done, are dropped
        self.runner.release(request_id)

    def has_work(self) -> bool:
        return self.runner.has_work() or self._in_flight > 0

    def step(self, sink: OutputSink) -> None:
        if self.runner.has_work():
            self.runner.step(_Recorder(self, sink))
            wait = 0.0
        else:
            wait = _IDLE_WAIT_S
        while self._in_flight > len(self._step_jobs):
            try:
                result = self._results.get(timeout=wait) if wait else self._results.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            self._in_flight -= 1
            self._collect(result, sink)
        # The step's jobs go to the worker as one item, so those of requests that ended together are aligned in
        # one batch, not the first alone.
        if self._step_jobs:
            self._jobs.put(self._step_jobs)
            self._step_jobs = []

    def close(self) -> None:
        self._jobs.put(None)
        if (close := getattr(self.runner, "close", None)) is not None:
            close()

    def __getattr__(self, name: str):
        """Everything else (voice cloning, fds to wait on) is the wrapped runner's."""
        return getattr(self.runner, name)

    # the requests' jobs (engine thread)

    def _heard(self, request_id: str, pcm: np.ndarray) -> None:
        """More of a request's audio: a partial job, when `STEP_S` more has come and none of its jobs runs."""
        timed = self._timed.get(request_id)
        if timed is None:
            return
        timed.chunks.append(np.asarray(pcm, dtype=np.float32))
        timed.held += len(pcm)
        self._queue_partial(request_id, timed)

    def _queue_partial(self, request_id: str, timed: _Timed) -> None:
        received = timed.base + timed.held
        rate = self.info.sample_rate
        now = self._clock()
        longest = self._aligner.longest_job_s
        paced = now - timed.partial_time >= STEP_S or (longest is not None and timed.held > longest * rate)
        if timed.busy or timed.ended or received - timed.partial_at < STEP_S * rate or not paced:
            return
        words = list(_WORD.finditer(timed.text))
        if not timed.text_complete and words and words[-1].end() == len(timed.text):
            words.pop()  # may still grow
        seconds = min(timed.held / rate, _PARTIAL_MAX_S)
        most = timed.committed + math.ceil(seconds * _MAX_WORDS_PER_S) + _SPARE_WORDS
        if len(words) > timed.committed:
            timed.partial_at, timed.partial_time = received, now
            self._queue(request_id, timed, words[max(timed.committed - 1, 0) : most], final=False)

    def _spoken(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> bool:
        """The model finished a request: True if its end waits for its alignment."""
        timed = self._timed.get(request_id)
        if timed is None:
            return False
        timed.ended = (reason, input_tokens, output_tokens)
        timed.final_queued = True
        self._queue(request_id, timed, None, final=True)  # its words left, if any, are the worker's to find
        return True

    def _queue(self, request_id: str, timed: _Timed, words: list[re.Match] | None, final: bool) -> None:
        """A job for `words` (from the last committed one on), or for the words left (None, a final job)."""
        rate = self.info.sample_rate
        samples = timed.held if final else min(timed.held, round(_PARTIAL_MAX_S * rate))
        timed.busy = True
        self._in_flight += 1
        self._step_jobs.append(_Job(request_id, timed, timed.committed, max(timed.committed - 1, 0), words,
                                    timed.text, timed.floor, list(timed.chunks), samples, timed.base / rate,
                                    (timed.base + samples) / rate, final))

    def _collect(self, result: _Aligned, sink: OutputSink) -> None:
        job = result.job
        timed = job.timed
        if self._timed.get(job.request_id) is not timed:  # released (or failed) meanwhile
            return
        if timed.final_queued and not job.final:  # stale: the final job aligns its words again
            return
        timed.busy = False
        if result.spans is not None:
            skip = timed.committed - job.first  # the committed word it starts at
            spans = bounded(shifted(result.spans[skip:], job.offset), job.floor, job.end)
            first, words = timed.committed, job.words[skip:]
            count = len(spans) if job.final else stable_count(spans, timed.previous, first, job.end)
            if count:
                sink.words(job.request_id, _timings(words[:count], spans[:count]))
                self._commit(timed, count, *spans[count - 1])
            if not job.final:
                timed.previous = uncommitted_starts(spans, first, count)
        if job.final:
            del self._timed[job.request_id]
            sink.finished(job.request_id, *timed.ended)
        else:
            self._queue_partial(job.request_id, timed)

    def _commit(self, timed: _Timed, count: int, start: float, end: float) -> None:
        """`count` more words are sent, the last spoken from `start` to `end` s: the audio before it is dropped."""
        timed.committed += count
        timed.floor = end
        cut = min(max(round(start * self.info.sample_rate) - timed.base, 0), timed.held)
        if cut:
            timed.chunks = _dropped(timed.chunks, cut)
            timed.base += cut
            timed.held -= cut

    # alignment (worker thread)

    def _align_jobs(self) -> None:
        while (jobs := self._jobs.get()) is not None:
            while len(jobs) < _MAX_BATCH:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # closing: align what was taken, then stop
                    break
                jobs = jobs + more
            for start in range(0, len(jobs), _MAX_BATCH):
                batch = jobs[start : start + _MAX_BATCH]
                for job, spans in zip(batch, self._align(batch), strict=True):
                    self._results.put(_Aligned(job, spans))

    def _align(self, jobs: list[_Job]) -> list[Spans | None]:
        """Each job's spans (None: its audio could not be aligned); a final job with no words left has none."""
        rate = self.info.sample_rate
        for job in jobs:
            if job.words is None:
                words = list(_WORD.finditer(job.text))
                job.words = words[job.first :] if len(words) > job.committed else []
        aligned = [job for job in jobs if job.words]
        try:
            results = self._aligner.align_batch(
                [(_joined(job.chunks, job.samples), rate, [m.group() for m in job.words]) for job in aligned],
                open_end=[not job.final for job in aligned]) if aligned else []
        except Exception:  # a bug must not keep the requests from ending
            log.exception("requests %s: alignment failed", ", ".join(job.request_id for job in aligned))
            results = [None] * len(aligned)
        by_job = dict(zip(map(id, aligned), results, strict=True))
        out: list[Spans | None] = []
        for job in jobs:
            spans = by_job.get(id(job), [])
            if isinstance(spans, AlignmentFailed):
                if job.final:
                    log.warning("request %s: its audio could not be aligned with its text (%s); its last %d words "
                                "get no timings", job.request_id, spans, len(job.words))
                spans = None
            out.append(spans)
        return out


def _joined(chunks: list[np.ndarray], samples: int) -> np.ndarray:
    """The first `samples` samples of `chunks`, as one array."""
    return np.concatenate(chunks)[:samples] if chunks else np.zeros(0, np.float32)


def _dropped(chunks: list[np.ndarray], count: int) -> list[np.ndarray]:
    """`chunks` less their first `count` samples (views: nothing is copied)."""
    out = []
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
        else:
            out.append(chunk[count:])
            count = 0
    return out


def _timings(words: list[re.Match], spans: Spans) -> WordTimings:
    return WordTimings(words=[m.group() for m in words], start=[start for start, _ in spans],
                       end=[end for _, end in spans], char_start=[m.start() for m in words],
                       char_end=[m.end() for m in words])


class _Recorder:
    """The sink the wrapped runner writes to: audio passes straight on (and is kept for alignment)."""

    def __init__(self, owner: AligningRunner, sink: OutputSink) -> None:
        self._owner = owner
        self._sink = sink

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        self._sink.audio(request_id, pcm)
        self._owner._heard(request_id, pcm)

    def words(self, request_id: str, timings: WordTimings) -> None:
        self._sink.words(request_id, timings)

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        if not self._owner._spoken(request_id, reason, input_tokens, output_tokens):
            self._sink.finished(request_id, reason, input_tokens, output_tokens)

    def failed(self, request_id: str, error: RequestError) -> None:
        self._owner._timed.pop(request_id, None)
        self._sink.failed(request_id, error)

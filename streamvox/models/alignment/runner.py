"""Word timings for a model that cannot time its own words: its audio, aligned with its text.

`AligningRunner` wraps a model's runner. Requests that ask for `word_timestamps` have their
audio (as it is sent, untouched and undelayed) and their text kept; once such a request's audio
is complete, a worker thread aligns the two, and the request's timings are sent, then its end.
The worker takes every request waiting when it comes round (up to `_MAX_BATCH`) and aligns them
together (`align_batch`: one forward of a GPU aligner).
The audio path never waits on alignment: only the request's end does. Audio that cannot be
aligned gets no timings at all (never guessed ones), and the request ends normally.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from dataclasses import dataclass, field

import msgspec
import numpy as np

from streamvox.contract import OutputSink, RequestError, Runner, SpeechRequest, WordTimings
from streamvox.models.alignment.word_aligner import AlignmentFailed, WordAligner

log = logging.getLogger(__name__)

_WORD = re.compile(r"\S+")
_IDLE_WAIT_S = 0.005  # how long a step waits for an alignment when the model has nothing to do
_MAX_BATCH = 32  # requests aligned together


@dataclass
class _Timed:
    text: str
    audio: list[np.ndarray] = field(default_factory=list)


@dataclass
class _Aligned:
    request_id: str
    timings: WordTimings | None


class AligningRunner:
    """A `Runner` that adds word timings (`ModelInfo.word_timestamps`) to `runner` with `aligner`."""

    def __init__(self, runner: Runner, aligner: WordAligner) -> None:
        self.runner = runner
        self.info = msgspec.structs.replace(runner.info, word_timestamps=True)
        self._aligner = aligner
        self._timed: dict[str, _Timed] = {}  # requests that asked for timings, while the model speaks them
        self._ending: dict[str, tuple[str, int, int]] = {}  # spoken, being aligned: their `finished` arguments
        self._jobs: queue.SimpleQueue[tuple[str, np.ndarray, str] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[_Aligned] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._align_jobs, name="aligner", daemon=True)
        self._worker.start()

    # Runner

    def add(self, request: SpeechRequest) -> None:
        self.runner.add(request)
        if request.word_timestamps:
            self._timed[request.request_id] = _Timed(request.text)

    def feed_text(self, request_id: str, text: str) -> None:
        if (timed := self._timed.get(request_id)) is not None:
            timed.text += text
        self.runner.feed_text(request_id, text)

    def end_input(self, request_id: str) -> None:
        self.runner.end_input(request_id)

    def release(self, request_id: str) -> None:
        self._timed.pop(request_id, None)
        self._ending.pop(request_id, None)  # its alignment, when done, is dropped
        self.runner.release(request_id)

    def has_work(self) -> bool:
        return self.runner.has_work() or bool(self._ending)

    def step(self, sink: OutputSink) -> None:
        if self.runner.has_work():
            self.runner.step(_Recorder(self, sink))
            wait = 0.0
        else:
            wait = _IDLE_WAIT_S
        while self._ending:
            try:
                result = self._results.get(timeout=wait) if wait else self._results.get_nowait()
            except queue.Empty:
                return
            wait = 0.0
            ended = self._ending.pop(result.request_id, None)
            if ended is None:  # released meanwhile
                continue
            if result.timings is not None and len(result.timings):
                sink.words(result.request_id, result.timings)
            sink.finished(result.request_id, *ended)

    def close(self) -> None:
        self._jobs.put(None)
        if (close := getattr(self.runner, "close", None)) is not None:
            close()

    def __getattr__(self, name: str):
        """Everything else (voice cloning, fds to wait on) is the wrapped runner's."""
        return getattr(self.runner, name)

    # alignment

    def _spoken(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> bool:
        """The model finished a request: True if its end waits for its alignment."""
        timed = self._timed.pop(request_id, None)
        if timed is None:
            return False
        audio = np.concatenate(timed.audio) if timed.audio else np.zeros(0, np.float32)
        self._ending[request_id] = (reason, input_tokens, output_tokens)
        self._jobs.put((request_id, audio, timed.text))
        return True

    def _align_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            jobs = [job]
            while len(jobs) < _MAX_BATCH:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # closing: align what was taken, then stop
                    break
                jobs.append(job)
            for request_id, timings in zip((job[0] for job in jobs), self._align(jobs), strict=True):
                self._results.put(_Aligned(request_id, timings))

    def _align(self, jobs: list[tuple[str, np.ndarray, str]]) -> list[WordTimings | None]:
        """Each job's timings (None: it has no words, or its audio could not be aligned)."""
        rate = self.info.sample_rate
        words = [list(_WORD.finditer(text)) for _, _, text in jobs]
        asked = [i for i, matches in enumerate(words) if matches]
        out: list[WordTimings | None] = [None] * len(jobs)
        if not asked:
            return out
        try:
            results = self._aligner.align_batch([(jobs[i][1], rate, [m.group() for m in words[i]]) for i in asked])
        except Exception:  # a bug must not keep the requests from ending
            log.exception("requests %s: alignment failed", ", ".join(jobs[i][0] for i in asked))
            return out
        for i, spans in zip(asked, results, strict=True):
            request_id, audio, _ = jobs[i]
            if isinstance(spans, AlignmentFailed):
                log.warning("request %s: its audio could not be aligned with its text (%s); it gets no word timings",
                            request_id, spans)
                continue
            duration = len(audio) / rate
            out[i] = WordTimings(
                words=[m.group() for m in words[i]],
                start=[min(start, duration) for start, _ in spans],
                end=[min(end, duration) for _, end in spans],
                char_start=[m.start() for m in words[i]],
                char_end=[m.end() for m in words[i]],
            )
        return out


class _Recorder:
    """The sink the wrapped runner writes to: audio passes straight on (and is kept for alignment)."""

    def __init__(self, owner: AligningRunner, sink: OutputSink) -> None:
        self._owner = owner
        self._sink = sink

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        self._sink.audio(request_id, pcm)
        if (timed := self._owner._timed.get(request_id)) is not None:
            timed.audio.append(np.array(pcm, dtype=np.float32))

    def words(self, request_id: str, timings: WordTimings) -> None:
        self._sink.words(request_id, timings)

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        if not self._owner._spoken(request_id, reason, input_tokens, output_tokens):
            self._sink.finished(request_id, reason, input_tokens, output_tokens)

    def failed(self, request_id: str, error: RequestError) -> None:
        self._owner._timed.pop(request_id, None)
        self._sink.failed(request_id, error)

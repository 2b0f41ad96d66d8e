"""`AligningRunner` while a request speaks: words are committed before its end, at eSpeak's own times."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from streamvox.contract import ModelInfo, SpeechRequest, WordTimings
from streamvox.models.alignment.pocketsphinx_aligner import PocketsphinxAligner
from streamvox.models.alignment.runner import AligningRunner
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary
from tests.helpers.recording_sink import RecordingSink

TEXT = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore every summer. "
        "The meeting has been moved from Tuesday to Thursday afternoon. The train to Boston leaves at 7:45 from "
        "platform 3.")
CHUNK_S = 0.1
TEXT_LEAD_S = 1.0  # the text is fed this far ahead of the audio that says it, a few letters at a time


class StreamingRunner:
    """A model without word timings that takes streaming text: one request, its prepared audio in `CHUNK_S`
    chunks, one a step; the text it is fed is ignored."""

    def __init__(self, pcm: np.ndarray, rate: int) -> None:
        self.info = ModelInfo(name="stub", family="stub", sample_rate=rate, voices=["v"], default_voice="v")
        step = int(rate * CHUNK_S)
        self.chunks = [pcm[i : i + step] for i in range(0, len(pcm), step)]
        self.active: set[str] = set()

    def add(self, request):
        self.active.add(request.request_id)

    def feed_text(self, request_id, text):
        pass

    def end_input(self, request_id):
        pass

    def release(self, request_id):
        self.active.discard(request_id)

    def has_work(self):
        return bool(self.active)

    def step(self, sink):
        for request_id in list(self.active):
            if self.chunks:
                sink.audio(request_id, self.chunks.pop(0))
            else:
                self.active.discard(request_id)
                sink.finished(request_id, "stop", 1, 2)


@pytest.fixture(scope="module")
def spoken():
    """eSpeak's audio of TEXT, its rate, and each word's start per eSpeak (words with an event of their own)."""
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    parts, events = [], []
    espeak.synthesize(TEXT, lambda pcm: parts.append(pcm) or True, events)
    ends = [m.end() for m in re.finditer(r"\S+", TEXT)]
    starts: dict[int, float] = {}
    for event in events:
        if event.kind == EVENT_WORD:
            starts.setdefault(next(k for k, end in enumerate(ends) if end > event.text_position - 1),
                              event.sample / espeak.sample_rate)
    return espeak, np.concatenate(parts).astype(np.float32) / 32768.0, starts


def _speak(runner: AligningRunner, sink: RecordingSink, truth: dict[int, float],
           release_at_s: float | None = None) -> None:
    """Streams request "r": text fed ahead of its audio, each step's alignments waited for (an aligner that
    keeps up with the audio), until it ends or `release_at_s` seconds of its audio have been sent."""
    words = list(re.finditer(r"\S+", TEXT))
    due = [truth.get(i, truth[max(k for k in truth if k < i)] if i else 0.0) for i in range(len(words))]
    fed = words[2].start()
    runner.add(SpeechRequest(request_id="r", text=TEXT[:fed], text_complete=False, word_timestamps=True))
    rate = runner.info.sample_rate
    deadline = time.monotonic() + 60
    while runner.has_work() and time.monotonic() < deadline:
        heard = sum(n for kind, _, n in sink.log if kind == "audio") / rate
        if release_at_s is not None and heard >= release_at_s:
            runner.release("r")
            return
        ahead = max((m.end() for m, at in zip(words, due, strict=True) if at <= heard + TEXT_LEAD_S), default=0)
        if fed < len(TEXT) and fed <= ahead:
            while fed <= ahead:
                runner.feed_text("r", TEXT[fed : fed + 3])  # pieces that split words
                fed += 3
            if fed >= len(TEXT):
                runner.end_input("r")
        runner.step(sink)
        while runner._in_flight and runner._results.empty() and time.monotonic() < deadline:
            time.sleep(0.001)


def _aligning(spoken, sink: RecordingSink, real_time: bool = True) -> AligningRunner:
    """The aligning runner over `StreamingRunner`. Its clock is the audio sent so far (`real_time`: the model
    keeps pace with playback) or stands still (a model far faster than real time)."""
    espeak, pcm, _ = spoken
    rate = espeak.sample_rate
    clock = (lambda: sum(n for kind, _, n in sink.log if kind == "audio") / rate) if real_time else (lambda: 0.0)
    return AligningRunner(StreamingRunner(pcm, rate), PocketsphinxAligner(espeak.phonemes), clock=clock)


def test_words_are_committed_while_the_request_speaks_at_espeaks_times(spoken):
    espeak, pcm, truth = spoken
    sink = RecordingSink()
    runner = _aligning(spoken, sink)
    _speak(runner, sink, truth)
    runner.close()
    kinds = [kind for kind, _, _ in sink.log]
    assert kinds[-1] == "finished" and not runner.has_work()
    last_audio = max(i for i, kind in enumerate(kinds) if kind == "audio")
    early = [t for i, (kind, _, t) in enumerate(sink.log) if kind == "words" and i < last_audio]
    committed = sum(len(t) for t in early)
    timings = WordTimings.join([t for kind, _, t in sink.log if kind == "words"])
    matches = list(re.finditer(r"\S+", TEXT))
    assert list(zip(timings.words, timings.char_start, timings.char_end, strict=True)) == \
        [(m.group(), m.start(), m.end()) for m in matches]  # every word once, in order, verbatim
    assert committed >= len(matches) // 2, committed  # most words before the audio's end
    errors = {i: abs(timings.start[i] - start) for i, start in truth.items()}
    assert all(errors[i] < 0.06 for i in range(committed) if i in errors), {i: round(e, 3) for i, e in errors.items()}
    assert np.mean(list(errors.values())) < 0.03, errors
    assert timings.start == sorted(timings.start) and timings.end == sorted(timings.end)
    assert all(s <= e for s, e in zip(timings.start, timings.end, strict=True))
    assert 0 <= timings.start[0] and timings.end[-1] <= len(pcm) / espeak.sample_rate


def _batch_sizes(aligner) -> list[int]:
    """The size of each batch `aligner` aligns from now on (its `align_batch` wrapped to record them)."""
    sizes: list[int] = []
    align_batch = aligner.align_batch

    def recorded(items, open_end=None):
        sizes.append(len(items))
        return align_batch(items, open_end)

    aligner.align_batch = recorded
    return sizes


def test_a_model_faster_than_real_time_gets_fewer_partial_jobs(spoken):
    espeak, pcm, truth = spoken
    jobs = {}
    for real_time in (True, False):
        sink = RecordingSink()
        runner = _aligning(spoken, sink, real_time)
        sizes = _batch_sizes(runner._aligner)
        _speak(runner, sink, truth)
        runner.close()
        jobs[real_time] = sum(sizes)
        timings = WordTimings.join([t for kind, _, t in sink.log if kind == "words"])
        assert len(timings) == len(TEXT.split())  # every word timed, either way
        errors = [abs(timings.start[i] - start) for i, start in truth.items()]
        assert np.mean(errors) < 0.03, errors
    # Paced by audio, a job every 1.5 s of it (~9 for 13 s); with no wall time passing, only past 8 s of
    # audio waiting for timings, and the final one.
    assert jobs[False] <= 4 < jobs[True], jobs


def test_a_released_request_keeps_its_committed_words_and_gets_no_more(spoken):
    espeak, pcm, truth = spoken
    sink = RecordingSink()
    runner = _aligning(spoken, sink)
    _speak(runner, sink, truth, release_at_s=len(pcm) / espeak.sample_rate * 0.6)
    before = WordTimings.join([t for kind, _, t in sink.log if kind == "words"])
    assert len(before) >= 5  # committed before the release
    assert all(abs(before.start[i] - truth[i]) < 0.06 for i in range(len(before)) if i in truth)
    logged = len(sink.log)
    deadline = time.monotonic() + 10
    while runner.has_work() and time.monotonic() < deadline:  # the jobs in flight come back, and are dropped
        runner.step(sink)
    assert not runner.has_work() and len(sink.log) == logged and "r" not in runner._timed
    runner.close()

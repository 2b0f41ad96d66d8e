"""`AligningRunner`: a model without word timings gets them from its audio, after the audio, before its end."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from streamvox.contract import ModelInfo, RequestError, SpeechRequest, WordTimings
from streamvox.models.alignment import runner as runner_module
from streamvox.models.alignment.pocketsphinx_aligner import PocketsphinxAligner
from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner
from streamvox.models.alignment.runner import AligningRunner
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary
from tests.helpers.qwen3_aligner_tiny import build_tiny_aligner
from tests.helpers.recording_sink import RecordingSink

TEXTS = {"a": "Captions need word timings, 42 of them.", "b": "A second request is timed on its own."}


class SpeakingRunner:
    """A model without word timings: it says the prepared audio of the text a request starts with, in 0.1 s
    chunks, one per request per step."""

    def __init__(self, audio: dict[str, np.ndarray], rate: int) -> None:
        self.info = ModelInfo(name="stub", family="stub", sample_rate=rate, voices=["v"], default_voice="v")
        self.audio = audio
        self.rate = rate
        self.active: dict[str, list[np.ndarray]] = {}

    def add(self, request: SpeechRequest) -> None:
        if request.text == "refuse":
            raise RequestError("no")
        pcm = next(pcm for text, pcm in self.audio.items() if text.startswith(request.text))  # text may follow
        step = self.rate // 10
        self.active[request.request_id] = [pcm[i : i + step] for i in range(0, len(pcm), step)]

    def feed_text(self, request_id, text):
        pass

    def end_input(self, request_id):
        pass

    def release(self, request_id):
        self.active.pop(request_id, None)

    def has_work(self):
        return bool(self.active)

    def step(self, sink):
        for request_id, chunks in list(self.active.items()):
            if chunks:
                sink.audio(request_id, chunks.pop(0))
            else:
                del self.active[request_id]
                sink.finished(request_id, "stop", 1, 2)


@pytest.fixture(scope="module")
def spoken():
    """eSpeak's audio of each text (and of silence), its rate, and each text's word starts per eSpeak."""
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    audio, truth = {}, {}
    for text in TEXTS.values():
        parts, events = [], []
        espeak.synthesize(text, lambda pcm, parts=parts: parts.append(pcm) or True, events)
        audio[text] = np.concatenate(parts).astype(np.float32) / 32768.0
        ends = [m.end() for m in re.finditer(r"\S+", text)]
        starts = {}
        for event in events:
            if event.kind == EVENT_WORD:
                starts.setdefault(next(k for k, end in enumerate(ends) if end > event.text_position - 1),
                                  event.sample / espeak.sample_rate)
        truth[text] = starts
    audio["silence"] = np.zeros(espeak.sample_rate, np.float32)
    return espeak, audio, truth


def _run(runner: AligningRunner, sink: RecordingSink, until=lambda: False) -> None:
    deadline = time.monotonic() + 60
    while runner.has_work() and time.monotonic() < deadline and not until():
        runner.step(sink)


def test_timings_follow_the_audio_and_precede_the_end(spoken):
    espeak, audio, truth = spoken
    runner = AligningRunner(SpeakingRunner(audio, espeak.sample_rate), PocketsphinxAligner(espeak.phonemes))
    assert runner.info.word_timestamps
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="a", text=TEXTS["a"][:20], text_complete=False, word_timestamps=True))
    runner.feed_text("a", TEXTS["a"][20:])  # the text a request is timed against includes what was fed
    runner.add(SpeechRequest(request_id="b", text=TEXTS["b"], word_timestamps=True))
    runner.add(SpeechRequest(request_id="plain", text=TEXTS["b"]))
    _run(runner, sink)
    for request_id in ("a", "b"):
        text = TEXTS[request_id]
        kinds = [kind for kind, rid, _ in sink.log if rid == request_id]
        assert kinds[-2:] == ["words", "finished"]
        timings = WordTimings.join([t for kind, rid, t in sink.log if kind == "words" and rid == request_id])
        assert [(w, a, b) for w, a, b in zip(timings.words, timings.char_start, timings.char_end, strict=True)] == \
            [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        errors = [abs(timings.start[i] - start) for i, start in truth[text].items()]
        assert np.mean(errors) < 0.03 and max(errors) < 0.1, errors
        assert timings.end[-1] <= len(audio[text]) / espeak.sample_rate
    assert [kind for kind, rid, _ in sink.log if rid == "plain"][-1] == "finished"
    assert not any(kind == "words" and rid == "plain" for kind, rid, _ in sink.log)
    runner.close()


def test_unalignable_audio_gets_no_timings_and_a_released_request_nothing(spoken):
    espeak, audio, _ = spoken
    audio = {**audio, "Hello there.": audio["silence"]}
    runner = AligningRunner(SpeakingRunner(audio, espeak.sample_rate), PocketsphinxAligner(espeak.phonemes))
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="quiet", text="Hello there.", word_timestamps=True))
    runner.add(SpeechRequest(request_id="gone", text=TEXTS["a"], word_timestamps=True))
    _run(runner, sink, until=lambda: runner._timed["gone"].ended is not None)
    runner.release("gone")  # cancelled while its alignment runs
    _run(runner, sink)
    time.sleep(0.2)
    runner.step(sink)
    assert [kind for kind, rid, _ in sink.log if rid == "quiet"][-1] == "finished"
    assert not any(kind in ("words", "finished") and rid == "gone" for kind, rid, _ in sink.log)
    assert not any(kind == "words" for kind, _, _ in sink.log)
    with pytest.raises(RequestError):
        runner.add(SpeechRequest(request_id="r", text="refuse", word_timestamps=True))
    assert "r" not in runner._timed
    runner.close()


class GatedAligner:
    """The tiny Qwen3 aligner, holding its first batch until `gate` opens; records each batch's size."""

    def __init__(self, aligner: Qwen3ForcedAligner) -> None:
        self.aligner = aligner
        self.longest_job_s = aligner.longest_job_s
        self.gate = threading.Event()
        self.sizes: list[int] = []

    def align_batch(self, items, open_end=None):
        self.sizes.append(len(items))
        self.gate.wait(60)
        return self.aligner.align_batch(items, open_end)


def test_requests_waiting_together_are_aligned_in_one_batch(spoken, tmp_path, monkeypatch):
    espeak, audio, _ = spoken
    monkeypatch.setattr(runner_module, "STEP_S", 1e9)  # final jobs only
    texts = {f"r{i}": text for i, text in enumerate([TEXTS["a"], TEXTS["b"], TEXTS["a"], TEXTS["b"]])}
    aligner = GatedAligner(Qwen3ForcedAligner.from_pretrained(build_tiny_aligner(tmp_path / "aligner")))
    runner = AligningRunner(SpeakingRunner(audio, espeak.sample_rate), aligner)
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="r0", text=texts["r0"], word_timestamps=True))
    _run(runner, sink, until=lambda: aligner.sizes)  # r0 is spoken, and its alignment holds the worker
    for request_id in ("r1", "r2", "r3"):
        runner.add(SpeechRequest(request_id=request_id, text=texts[request_id], word_timestamps=True))
    _run(runner, sink, until=lambda: sum(timed.ended is not None for timed in runner._timed.values()) == 4)
    aligner.gate.set()
    _run(runner, sink)
    assert aligner.sizes == [1, 3]
    for request_id, text in texts.items():
        kinds = [kind for kind, rid, _ in sink.log if rid == request_id]
        assert kinds[-2:] == ["words", "finished"]
        timings = next(t for kind, rid, t in sink.log if kind == "words" and rid == request_id)
        assert timings.words == text.split()
        assert timings.start == sorted(timings.start) and timings.end == sorted(timings.end)
        assert all(0 <= s <= e <= len(audio[text]) / espeak.sample_rate for s, e in zip(timings.start, timings.end,
                                                                                        strict=True))
    runner.close()


def test_requests_ending_in_one_step_are_aligned_in_one_batch(spoken, tmp_path, monkeypatch):
    """Their final jobs reach the worker together, whenever its thread runs (not the first job alone)."""
    espeak, audio, _ = spoken
    monkeypatch.setattr(runner_module, "STEP_S", 1e9)  # final jobs only
    aligner = GatedAligner(Qwen3ForcedAligner.from_pretrained(build_tiny_aligner(tmp_path / "aligner")))
    aligner.gate.set()
    runner = AligningRunner(SpeakingRunner(audio, espeak.sample_rate), aligner)
    sink = RecordingSink()
    for request_id in ("r0", "r1", "r2"):  # the same audio: they end in the same step
        runner.add(SpeechRequest(request_id=request_id, text=TEXTS["b"], word_timestamps=True))
    _run(runner, sink)
    assert aligner.sizes == [3]
    assert sorted(rid for kind, rid, _ in sink.log if kind == "finished") == ["r0", "r1", "r2"]
    runner.close()


def test_a_final_job_is_queued_at_once_and_a_running_partial_one_dropped(spoken, tmp_path):
    espeak, audio, _ = spoken
    text = TEXTS["a"]
    aligner = GatedAligner(Qwen3ForcedAligner.from_pretrained(build_tiny_aligner(tmp_path / "aligner")))
    ticks = iter(range(10**6))
    runner = AligningRunner(SpeakingRunner(audio, espeak.sample_rate), aligner, clock=lambda: float(next(ticks)))
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="r", text=text, word_timestamps=True))
    _run(runner, sink, until=lambda: runner._in_flight)  # a partial job is queued: no step until the worker has it
    deadline = time.monotonic() + 60
    while not aligner.sizes:  # held by the gate
        assert time.monotonic() < deadline
        time.sleep(0.001)
    _run(runner, sink, until=lambda: runner._timed["r"].ended is not None)
    assert runner._timed["r"].final_queued and aligner.sizes == [1]  # queued while the partial one runs
    aligner.gate.set()
    _run(runner, sink)
    assert aligner.sizes == [1, 1]
    words = [t for kind, rid, t in sink.log if kind == "words"]
    assert len(words) == 1 and words[0].words == text.split()  # the final job's, every word once
    assert [kind for kind, _, _ in sink.log][-2:] == ["words", "finished"]
    runner.close()

"""The eSpeak runner driven directly through the runner contract (no engine core, no HTTP)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from streamvox.contract import SpeechRequest
from streamvox.models.espeak.runner import EspeakRunner


class Sink:
    """An `OutputSink` that keeps everything."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}
        self.done: dict[str, tuple[str, int, int]] = {}

    def audio(self, request_id, pcm):
        self.parts.setdefault(request_id, []).append(pcm)

    def finished(self, request_id, reason, input_tokens, output_tokens):
        self.done[request_id] = (reason, input_tokens, output_tokens)

    def failed(self, request_id, error):
        raise AssertionError(error.message)


def _run(runner: EspeakRunner, texts: list[str], check=None) -> Sink:
    """Requests r0, r1, ... for `texts`, stepped until all are done (or a minute has passed)."""
    sink = Sink()
    for i, text in enumerate(texts):
        runner.add(SpeechRequest(request_id=f"r{i}", text=text))
    deadline = time.monotonic() + 60
    while runner.has_work() and time.monotonic() < deadline:
        runner.step(sink)
        if check is not None:
            check(runner)
        time.sleep(0.001)
    return sink


@pytest.fixture(scope="module")
def runner():
    runner = EspeakRunner()
    yield runner
    runner.close()


def test_words_spoken_are_counted_and_text_without_words_is_silent(runner):
    """Text is spoken clause by clause (`streamvox.text_split`); pieces with no letter or digit are skipped. A
    text with nothing to say is a short silence (a client can decode it); whitespace alone is no audio."""
    sink = _run(runner, ["Hello there, world. How are you? fine", " ... , !", "  "])
    assert sink.done["r0"][:2] == ("stop", 7) and sink.done["r0"][2] > 0  # (reason, words, eSpeak buffers)
    assert sink.done["r1"] == ("stop", 0, 0) and sink.done["r2"] == ("stop", 0, 0)
    assert sum(len(part) for part in sink.parts["r0"]) > runner.info.sample_rate // 2
    silence = np.concatenate(sink.parts["r1"])
    assert len(silence) == runner.info.sample_rate // 10 and not silence.any()
    assert "r2" not in sink.parts


def test_an_openai_voice_speaks_the_language_asked_for(runner):
    """"nova" with language "de" is German in nova's variant (eSpeak's "de+f3"); an eSpeak voice keeps its own."""
    def audio(**fields) -> np.ndarray:
        sink = Sink()
        runner.add(SpeechRequest(request_id="r", text="Guten Morgen, wie geht es dir heute?", **fields))
        while runner.has_work():
            runner.step(sink)
            time.sleep(0.001)
        return np.concatenate(sink.parts["r"])

    german, plain_german = audio(voice="nova", language="de"), audio(voice="de")
    assert not np.array_equal(german, audio(voice="nova"))  # German, not nova's English
    assert not np.array_equal(german, plain_german)  # with nova's variant
    assert np.array_equal(audio(language="de"), plain_german)  # the language's own voice
    rp = audio(voice="en-gb-x-rp")
    assert np.array_equal(audio(voice="en-gb-x-rp", language="de"), rp)  # an eSpeak voice is kept


def test_streamed_text_sounds_the_same_as_whole_text(runner):
    text = "Streaming text arrives word by word, like tokens from a language model. Then it ends."
    whole = np.concatenate(_run(runner, [text]).parts["r0"])
    sink = Sink()
    runner.add(SpeechRequest(request_id="s", text="", text_complete=False))
    for i, word in enumerate(text.split(" ")):
        runner.feed_text("s", (" " if i else "") + word)
        runner.step(sink)
    runner.end_input("s")
    deadline = time.monotonic() + 60
    while runner.has_work() and time.monotonic() < deadline:
        runner.step(sink)
        time.sleep(0.001)
    assert sink.done["s"][:2] == ("stop", len(text.split()))
    assert np.array_equal(np.concatenate(sink.parts["s"]), whole)


def _process_state(pid: int) -> str:
    """"T" stopped, "R" running, ...; "X" once it has exited (and been reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def test_espeak_runs_at_most_the_background_limit_of_children_and_each_output_is_unchanged():
    """Background synthesis children beyond the limit are stopped until their turn; every request still gets
    exactly the audio it gets alone."""
    def run(runner, texts, check=None):
        sink = _run(runner, texts, check)
        assert len(sink.done) == len(texts)
        return [np.concatenate(sink.parts[f"r{i}"]) for i in range(len(texts))]

    runner = EspeakRunner(max_running_background=1)
    texts = [f"Request number {i} says something long enough to be stopped now and then. " * 3 for i in range(5)]
    solo = [run(runner, [text])[0] for text in texts]
    most_running, stopped_seen = 0, 0

    def check(runner):
        nonlocal most_running, stopped_seen
        background = runner._background.children.values()
        running = [c for c in background if not c.stopped]
        stopped = [c for c in background if c.stopped]
        most_running = max(most_running, len(running))
        stopped_seen = max(stopped_seen, len(stopped))
        for child in stopped:  # a signal takes a moment to land
            deadline = time.monotonic() + 1
            while (state := _process_state(child.pid)) not in ("T", "t", "X") and time.monotonic() < deadline:
                time.sleep(0.001)
            assert state in ("T", "t", "X"), state  # X: it finished just before the stop

    try:
        together = run(runner, texts, check)
    finally:
        runner.close()
    assert most_running <= 1 and stopped_seen >= 1
    for alone, concurrent in zip(solo, together, strict=True):
        assert np.array_equal(alone, concurrent)

"""eSpeak's word timings: its own synthesis events, mapped onto the input's words."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from streamvox.contract import SpeechRequest, WordTimings
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary, SynthEvent
from streamvox.models.espeak.runner import EspeakRunner
from streamvox.models.espeak.word_timing import ClauseWords
from streamvox.text_split import split_text

# "a" and "haired" get no event of their own; "1234" and "5.5" get several; "Dr." and "Jan." abbreviations.
TEXT = ("  It costs 1234 dollars, said a white-haired man;   Dr. Smith paid 5.5 on Jan. 3rd.\n"
        "Café naïve, déjà vu ... ok - yes!")


class Sink:
    def __init__(self) -> None:
        self.audio_parts: list[np.ndarray] = []
        self.timings: list[WordTimings] = []
        self.order: list[tuple[str, int]] = []  # ("audio", samples so far) / ("words", end sample)
        self.done = False

    def audio(self, request_id, pcm):
        self.audio_parts.append(pcm)
        self.order.append(("audio", sum(len(p) for p in self.audio_parts)))

    def words(self, request_id, timings):
        self.timings.append(timings)
        self.order.append(("words", round(timings.end[-1] * 22050)))

    def finished(self, request_id, reason, input_tokens, output_tokens):
        self.done = True

    def failed(self, request_id, error):
        raise AssertionError(error.message)


@pytest.fixture(scope="module")
def runner():
    runner = EspeakRunner()
    yield runner
    runner.close()


def _speak(runner: EspeakRunner, text: str, **fields) -> Sink:
    sink = Sink()
    runner.add(SpeechRequest(request_id="r", text=text, **fields))
    deadline = time.monotonic() + 60
    while runner.has_work() and time.monotonic() < deadline:
        runner.step(sink)
        time.sleep(0.001)
    assert sink.done
    return sink


def _clause_events(text: str) -> list[tuple[str, list[SynthEvent], int]]:
    """Each clause eSpeak speaks for `text`, with its events and its length in samples (a fresh library)."""
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    out = []
    for clause in split_text(text, "clause", max_words=24):
        events, samples = [], []
        espeak.synthesize(clause, lambda pcm, parts=samples: parts.append(len(pcm)) or True, events)
        out.append((clause, events, sum(samples)))
    return out


def _checked(sink: Sink, text: str, sample_rate: int) -> WordTimings:
    """The request's timings, checked: every word of `text` once, in order, times monotone within the audio."""
    timings = WordTimings.join(sink.timings)
    duration = sum(len(p) for p in sink.audio_parts) / sample_rate
    tokens = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    assert list(zip(timings.words, timings.char_start, timings.char_end, strict=True)) == tokens
    previous_end = 0.0
    for start, end in zip(timings.start, timings.end, strict=True):
        assert previous_end <= start <= end <= duration
        previous_end = end
    return timings


def test_timings_cover_every_word_in_order_within_the_audio(runner):
    sink = _speak(runner, TEXT, word_timestamps=True)
    _checked(sink, TEXT, runner.info.sample_rate)
    # each timing is sent after the audio it covers
    heard = 0
    for kind, value in sink.order:
        if kind == "audio":
            heard = value
        else:
            assert value <= heard + 1


def test_timings_are_espeaks_own_events(runner):
    timings = WordTimings.join(_speak(runner, TEXT, word_timestamps=True).timings)
    rate = runner.info.sample_rate
    word_index = 0
    offset = 0
    checked = 0
    for clause, events, samples in _clause_events(TEXT):
        words = list(re.finditer(r"\S+", clause))
        ends = [m.end() for m in words]
        first_event: dict[int, int] = {}
        for event in events:
            if event.kind == EVENT_WORD:
                i = next(k for k, end in enumerate(ends) if end > event.text_position - 1)
                first_event.setdefault(i, event.sample)
        for i, sample in first_event.items():
            assert timings.start[word_index + i] == pytest.approx((offset + sample) / rate, abs=1e-4)
            checked += 1
        word_index += len(words)
        offset += samples
    assert word_index == len(timings) and checked >= len(timings) - 6  # a few words have no event


def test_asking_for_timings_leaves_the_audio_unchanged(runner):
    plain = np.concatenate(_speak(runner, TEXT).audio_parts)
    timed = _speak(runner, TEXT, word_timestamps=True)
    assert np.array_equal(np.concatenate(timed.audio_parts), plain)


def test_words_without_events_share_the_gap_and_numbers_keep_one_entry():
    clause = "a white-haired man paid 1234"
    spans = [(m.start() + 10, m.end() + 10) for m in re.finditer(r"\S+", clause)]
    text = " " * 10 + clause
    events = [SynthEvent(EVENT_WORD, 3, 5, 100), SynthEvent(EVENT_WORD, 16, 3, 700),
              SynthEvent(EVENT_WORD, 24, 4, 1000), SynthEvent(EVENT_WORD, 25, 4, 1500),
              SynthEvent(EVENT_WORD, 25, 4, 1800)]
    words = ClauseWords(clause, spans, text, clause_start=2000, sample_rate=1000)
    sent = []
    for event in events:  # as eSpeak hands them over, a buffer each
        words.event(event)
        sent.append(words.ready())
    sent.append(words.end(sound_end=4200))
    # a word is sent once the next one's start is known: "a" with white-haired's event, "white-haired" with
    # man's, "man" and "paid" with 1234's first (its others change nothing); "1234" at the clause's end
    assert [part.words if part else None for part in sent] == [
        ["a"], ["white-haired"], ["man", "paid"], None, None, ["1234"]]
    timings = WordTimings.join([part for part in sent if part])
    assert timings.words == ["a", "white-haired", "man", "paid", "1234"]
    # "a" (no event) starts with the clause; "paid" (no event) shares man's time by letters (3:4)
    assert timings.start == [2.0, 2.1, 2.7, (2700 + 300 * 3 // 7) / 1000, 3.0]
    assert timings.end == timings.start[1:] + [4.2]
    assert words.ready() is None and words.end(sound_end=4200) is None


def test_a_requests_first_word_starts_at_its_own_event(runner):
    """The runner's voice checks leave eSpeak a queue of events that once pushed out the first word's."""
    text = "1234 dollars"
    (clause, events, _), = _clause_events(text)
    first = next(event for event in events if event.kind == EVENT_WORD)
    later = [event.sample for event in events if event.kind == EVENT_WORD and event.text_position == 2]
    assert first.text_position == 1 and later and later[0] > 0  # "1234" gets several events
    timings = WordTimings.join(_speak(runner, text, word_timestamps=True).timings)
    assert timings.words == ["1234", "dollars"]
    assert timings.start[0] == first.sample / runner.info.sample_rate


@pytest.mark.parametrize("text", ["... Hello!!! ??? Really?! 🍕", "Yes! ! ! No -", " -- ", "🍕"])
def test_words_in_no_clause_take_no_time_where_they_stand(runner, text):
    """Pieces with no letter or digit are not spoken, but their words are timed: zero length, in place."""
    timings = _checked(_speak(runner, text, word_timestamps=True), text, runner.info.sample_rate)
    for word, start, end in zip(timings.words, timings.start, timings.end, strict=True):
        if not any(ch.isalnum() for ch in word):
            assert start == end


@pytest.mark.parametrize("text", ["Stop! 😀 ??? 😀 go.", "Well, ??? — \n — fine."])
def test_a_clause_is_found_after_a_dropped_piece_that_holds_its_first_word(runner, text):
    """A piece with no letter or digit ("😀 ???") is not spoken; the next clause ("😀 go.") starts with one of its
    words. Its words are timed where they stand, and the dropped piece's too."""
    timings = _checked(_speak(runner, text, word_timestamps=True), text, runner.info.sample_rate)
    assert timings.start[1] == timings.end[1]  # the dropped piece's first word takes no time


def test_words_are_sent_while_their_clause_is_spoken(runner):
    """Not at the clause's end: a request stopped mid-clause keeps the timings of the words it spoke."""
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    assert len(split_text(text, "clause", max_words=24)) == 1
    sink = _speak(runner, text, word_timestamps=True)
    total = sum(len(p) for p in sink.audio_parts)
    heard = 0
    heard_at_words = []
    for kind, value in sink.order:
        if kind == "audio":
            heard = value
        else:
            heard_at_words.append(heard)
    assert len(heard_at_words) >= 10 and heard_at_words[0] < total / 4
    assert WordTimings.join(sink.timings).words == text.split()

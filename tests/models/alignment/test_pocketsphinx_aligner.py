"""PocketSphinx forced alignment on eSpeak's audio agrees with eSpeak's own word events."""

from __future__ import annotations

import re

import numpy as np
import pytest

from streamvox.models.alignment.pocketsphinx_aligner import AlignmentFailed, PocketsphinxAligner
from streamvox.models.alignment.pronunciation import arpabet, spoken_form
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Dr. Smith will see you on Monday, January 3rd, at 10 a.m.",
    "The invoice came to $1,234.56, including a 15% service charge.",
    "Sgt. Brown led the patrol through the forest.",
    "Turn left at the second light, then drive about 2.5 miles north.",
    "Jan. and Feb. are usually the coldest months here.",
    "A white-haired man sat quietly on the park bench - twice.",
]


@pytest.fixture(scope="module")
def espeak() -> EspeakLibrary:
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    return espeak


def _speak(espeak: EspeakLibrary, text: str) -> tuple[np.ndarray, list[float | None]]:
    """eSpeak's audio of `text` and each word's start per its own events (None: no event of its own)."""
    parts, events = [], []
    espeak.synthesize(text, lambda pcm: parts.append(pcm) or True, events)
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    starts: list[float | None] = [None] * len(ends)
    for event in events:
        if event.kind == EVENT_WORD:
            i = next(k for k, end in enumerate(ends) if end > event.text_position - 1)
            if starts[i] is None:
                starts[i] = event.sample / espeak.sample_rate
    return np.concatenate(parts).astype(np.float32) / 32768.0, starts


def test_word_starts_agree_with_espeaks_events(espeak):
    sentences = [(text, *_speak(espeak, text)) for text in SENTENCES]  # all spoken before any alignment
    aligner = PocketsphinxAligner(espeak.phonemes)
    errors = []
    for text, pcm, truth in sentences:
        spans = aligner.align(pcm, espeak.sample_rate, text.split())
        assert len(spans) == len(text.split())
        previous = 0.0
        for start, end in spans:
            assert previous <= start <= end <= len(pcm) / espeak.sample_rate + 0.01
            previous = end
        errors += [abs(start - t) for (start, _), t in zip(spans, truth, strict=True) if t is not None]
    errors = np.array(errors) * 1000
    assert errors.mean() <= 25 and np.percentile(errors, 90) <= 50, (errors.mean(), np.percentile(errors, 90))
    assert errors.max() <= 250


def test_a_word_with_nothing_to_say_gets_an_empty_span_and_silence_fails(espeak):
    aligner = PocketsphinxAligner(espeak.phonemes)
    pcm, _ = _speak(espeak, "Left - right")
    spans = aligner.align(pcm, espeak.sample_rate, ["Left", "-", "right"])
    assert spans[1][0] == spans[1][1] == spans[0][1]
    with pytest.raises(AlignmentFailed):
        aligner.align(np.zeros(22050, np.float32), espeak.sample_rate, ["hello"])


def test_espeak_phonemes_become_arpabet(espeak):
    assert " ".join(arpabet(espeak.phonemes("1234"))).startswith("W AH N TH AW Z AH N D")
    assert arpabet(espeak.phonemes("Sgt.")) == ["EH", "S", "JH", "IY", "T", "IY"]
    assert spoken_form("15%,") == "15%" and spoken_form('"(Dr.)"') == "dr"

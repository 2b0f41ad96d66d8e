"""Forced alignment of English speech with PocketSphinx: when each word of a known text is spoken.

The `pocketsphinx` wheel ships the en-us acoustic model and CMUdict, so nothing is
downloaded. Its search runs over a grammar of exactly the text's words (silence may
come between them), on 16 kHz audio in 10 ms frames. Words the dictionary lacks, and
every number, get eSpeak's pronunciation (`pronunciation.py`). Synthetic speech sits
far from what the acoustic model was trained on, so the beams are much wider than
PocketSphinx's defaults (with them, alignment of eSpeak's voice fails outright).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import soxr

from streamvox.models.alignment.pronunciation import arpabet, dictionary_key, needs_espeak, spoken, spoken_form
from streamvox.models.alignment.word_aligner import AlignItem, AlignmentFailed, Spans

RATE = 16000
_FRAME = 160  # samples of a 10 ms frame
_FRAME_S = 0.01
_MARGIN_FRAMES = 5  # of the silence before and after the speech that is aligned with it
_PAUSE_FRAMES = 8  # silent 10 ms frames at a word's edge that make a pause, not a consonant's closure
_ONSET_FRAMES = 1  # of silence kept before a word's sound after a pause (a synthesiser starts the word there)
_SILENCE_DB = -34  # a frame this far below the loud frames' level is silent
_MAX_ADDED_WORDS = 100_000  # pronunciations added for words outside the dictionary, before starting over


class PocketsphinxAligner:
    """Aligns mono audio with the words it says; one alignment at a time (not thread-safe)."""

    def __init__(self, phonemes: Callable[[str], list[str]]) -> None:
        """`phonemes`: eSpeak's phoneme names for a text (`EspeakLibrary.phonemes` with an English voice)."""
        import pocketsphinx  # an optional dependency: only servers started with --aligner pocketsphinx load it

        self._pocketsphinx = pocketsphinx
        self._phonemes = phonemes
        self._decoder = self._new_decoder()
        self._added: dict[str, str | None] = {}  # word outside the dictionary -> its entry (None: silent)

    def _new_decoder(self):
        return self._pocketsphinx.Decoder(lm=None, samprate=RATE, fsgusefiller=False, bestpath=False,
                                          loglevel="FATAL")

    def align(self, pcm: np.ndarray, sample_rate: int, words: list[str]) -> Spans:
        """(start, end) in seconds from the first sample of `pcm` for each of `words` (the text's
        whitespace-separated words, verbatim). A word with nothing to say ("-") gets an empty span
        where the previous word ended. Raises `AlignmentFailed`."""
        entries = [self._entry(word) for word in words]
        said = [entry for entry in entries if entry is not None]
        if not said:
            return [(0.0, 0.0)] * len(words)
        audio = soxr.resample(pcm.astype(np.float32), sample_rate, RATE) if sample_rate != RATE else pcm
        # Without silence in the grammar, the first and last words would have to absorb the silence around
        # the speech: cut it off (all but a margin) and count frames from the cut.
        loud = _loud_frames(audio)
        sounding = np.flatnonzero(loud)
        if not len(sounding):
            raise AlignmentFailed("the audio is silent")
        first = max(0, int(sounding[0]) - _MARGIN_FRAMES)
        last = min(len(loud), int(sounding[-1]) + 1 + _MARGIN_FRAMES)
        audio, loud = audio[first * _FRAME : last * _FRAME], loud[first:last]
        data = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        decoder = self._decoder
        try:
            decoder.set_align_text(" ".join(said))
            decoder.start_utt()
            decoder.process_raw(data, full_utt=True)
            decoder.end_utt()
        except RuntimeError as error:
            raise AlignmentFailed(str(error)) from error
        offset = first * _FRAME_S
        spans = [(round(start + offset, 3), round(end + offset, 3))
                 for start, end in self._word_spans(decoder.seg() or [], loud)]
        if len(spans) != len(said):
            raise AlignmentFailed(f"aligned {len(spans)} of {len(said)} words")
        out, previous_end, spans_iter = [], 0.0, iter(spans)
        for entry in entries:
            if entry is None:
                out.append((previous_end, previous_end))
                continue
            start, end = next(spans_iter)
            out.append((start, end))
            previous_end = end
        return out

    def align_batch(self, items: list[AlignItem]) -> list[Spans | AlignmentFailed]:
        """`align` of each item in turn: its spans, or its `AlignmentFailed`."""
        results: list[Spans | AlignmentFailed] = []
        for pcm, sample_rate, words in items:
            try:
                results.append(self.align(pcm, sample_rate, words))
            except AlignmentFailed as error:
                results.append(error)
        return results

    def _word_spans(self, segments, loud: np.ndarray) -> list[tuple[float, float]]:
        """The aligned words' (start, end) in seconds, without the pauses PocketSphinx put inside them.

        The grammar has no silence between words (with one, PocketSphinx loses its way in synthetic
        speech), so a pause joins a neighbouring word, in part or whole: a word whose sound lies after
        (before) a pause inside it starts (ends) at that pause's end (start).
        """
        spans = []
        for segment in segments:
            if segment.word in ("<s>", "</s>", "<sil>") or segment.word.startswith("["):
                continue
            first, last = segment.start_frame, min(segment.end_frame, len(loud) - 1)
            pause = _longest_pause(loud[first : last + 1])
            if pause is not None:
                pause_start, pause_end = first + pause[0], first + pause[1]
                if pause_start - first < last + 1 - pause_end:  # mostly sound after it: the word starts after it
                    first = max(first, pause_end - _ONSET_FRAMES)
                else:
                    last = pause_start - 1
            spans.append((first * _FRAME_S, (last + 1) * _FRAME_S))
        return spans

    def _entry(self, word: str) -> str | None:
        """The dictionary entry the grammar uses for `word`, with eSpeak's pronunciation added to it.

        eSpeak's reading is added as an alternative even where CMUdict has the word: abbreviations are
        where they part ("Sgt." is "sergeant" in CMUdict, spelled out by eSpeak; "Feb." is "february"
        or "feb"), and the search picks whichever the audio says. Numbers get eSpeak's reading only.
        """
        if not spoken(word):
            return None
        form = spoken_form(word) or word.lower()
        if form in self._added:
            return self._added[form]
        if len(self._added) >= _MAX_ADDED_WORDS:  # a long-running server meets unboundedly many numbers
            self._decoder = self._new_decoder()
            self._added.clear()
        phones = " ".join(arpabet(self._phonemes(word)))
        key = dictionary_key(word)
        if needs_espeak(key) or not key or self._decoder.lookup_word(key) is None:
            entry = "_" + form if phones else None  # "_": never a dictionary word ("_2" is not "2")
            if entry is not None:
                self._decoder.add_word(entry, phones, True)
        else:
            entry = key
            if phones:
                self._decoder.add_word(f"{key}(99)", phones, True)
        self._added[form] = entry
        return entry


def _loud_frames(audio: np.ndarray) -> np.ndarray:
    """Which 10 ms frames of 16 kHz audio are louder than silence."""
    frames = len(audio) // _FRAME
    if not frames:
        return np.zeros(0, bool)
    rms = np.sqrt(np.mean(audio[: frames * _FRAME].astype(np.float64).reshape(frames, _FRAME) ** 2, axis=1))
    level = np.percentile(rms, 95)
    return rms > level * 10 ** (_SILENCE_DB / 20)


def _longest_pause(loud: np.ndarray) -> tuple[int, int] | None:
    """(start, end) of the longest run of at least `_PAUSE_FRAMES` silent frames, else None."""
    edges = np.flatnonzero(np.diff(np.concatenate(([1], loud.astype(np.int8), [1]))))
    runs = edges.reshape(-1, 2)  # silent runs: [start, end)
    if not len(runs):
        return None
    longest = runs[np.argmax(runs[:, 1] - runs[:, 0])]
    return (int(longest[0]), int(longest[1])) if longest[1] - longest[0] >= _PAUSE_FRAMES else None

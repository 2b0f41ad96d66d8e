"""Forced alignment of English speech with PocketSphinx: when each word of a known text is spoken.

The `pocketsphinx` wheel ships the en-us acoustic model and CMUdict, so nothing is
downloaded. Its search runs over a grammar of exactly the text's words (silence may
come between them), on 16 kHz audio in 10 ms frames. Words the dictionary lacks, and
every number, get eSpeak's pronunciation (`pronunciation.py`). Synthetic speech sits
far from what the acoustic model was trained on, so the beams are much wider than
PocketSphinx's defaults (with them, alignment of eSpeak's voice fails outright).

The grammar is the text's words in order, with optional silence only after a word that ends in
punctuation (a sentence's or clause's pause: without it, the search loses its way across a
sentence break). With `open_end`, the audio may stop before the text does: the grammar may end
after any word, and the words it does not reach get empty spans at the audio's end.
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
_PAUSING = ".,;:!?"  # a word ending in one of these may be followed by silence
_EXIT_PROB = 0.1  # open end: the grammar's chance of ending after each word
# Open end: the last word reached ends at most this long before the audio's sound does. A search that lost
# its way takes an early exit, its last word stretched over all the rest (and then cut at a pause inside).
# Nor does any word it reaches sound longer than a slow speaker's reading of it.
_OPEN_END_SLACK_S = 0.3
_MAX_PAUSE_SOUND_S = 0.1  # of sound in a pause it finds
_MAX_WORD_S, _MAX_PHONE_S = 0.6, 0.2  # a word's longest span: the larger of these, the second per phone


class PocketsphinxAligner:
    """Aligns mono audio with the words it says; one alignment at a time (not thread-safe)."""

    # Across many sentences the search loses its way more often (a 13 s, four-sentence text fails whole).
    longest_job_s: float | None = 8.0

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

    def align(self, pcm: np.ndarray, sample_rate: int, words: list[str], open_end: bool = False) -> Spans:
        """(start, end) in seconds from the first sample of `pcm` for each of `words` (the text's
        whitespace-separated words, verbatim). A word with nothing to say ("-") gets an empty span
        where the previous word ended; with `open_end`, so does each word after the last one the
        audio reaches, at the audio's end. Raises `AlignmentFailed`."""
        entries = [self._entry(word) for word in words]
        said = [(entry, word) for entry, word in zip(entries, words, strict=True) if entry is not None]
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
        offset = first * _FRAME_S
        speech_end = (int(sounding[-1]) + 1) * _FRAME_S
        # A pause in the grammar loses the search in some sentences, and its absence in others (across a
        # sentence break): the whole text is tried without pauses first, an open end with them first.
        for pauses in (True, False) if open_end else (False, True):
            segments = self._search(data, said, open_end, pauses)
            found = self._word_spans(segments, loud)
            spans = [(round(start + offset, 3), round(end + offset, 3)) for start, end, _ in found]
            if open_end and spans and self._plausible_prefix(found, said, speech_end - offset) and \
                    _quiet_pauses(segments, loud):
                break
            if not open_end and len(spans) == len(said):
                break
        else:
            raise AlignmentFailed(f"aligned {len(spans)} of {len(said)} words")
        spans += [(round(len(pcm) / sample_rate, 3),) * 2] * (len(said) - len(spans))
        out, previous_end, spans_iter = [], 0.0, iter(spans)
        for entry in entries:
            if entry is None:
                out.append((previous_end, previous_end))
                continue
            start, end = next(spans_iter)
            out.append((start, end))
            previous_end = end
        return out

    def align_batch(self, items: list[AlignItem], open_end: list[bool] | None = None) -> list[Spans | AlignmentFailed]:
        """`align` of each item in turn: its spans, or its `AlignmentFailed`."""
        results: list[Spans | AlignmentFailed] = []
        for i, (pcm, sample_rate, words) in enumerate(items):
            try:
                results.append(self.align(pcm, sample_rate, words, bool(open_end and open_end[i])))
            except AlignmentFailed as error:
                results.append(error)
        return results

    def _plausible_prefix(self, found: list[tuple[float, float, float]], said: list[tuple[str, str]],
                          speech_end: float) -> bool:
        """Whether an open-ended search's words `found` (the first of `said`) look like the words the audio
        holds, not a search that lost its way."""
        if len(found) > len(said) or (len(found) < len(said) and found[-1][1] < speech_end - _OPEN_END_SLACK_S):
            return False
        for (_, _, sounding), (entry, _) in zip(found, said, strict=False):
            phones = len((self._decoder.lookup_word(entry) or "").split())
            if sounding > max(_MAX_WORD_S, _MAX_PHONE_S * phones):
                return False
        return True

    def _search(self, data: bytes, said: list[tuple[str, str]], open_end: bool, pauses: bool) -> list:
        """PocketSphinx's segments for 16-bit 16 kHz `data` in the words' grammar."""
        decoder = self._decoder
        try:
            decoder.add_fsg("align", self._grammar(said, open_end, pauses))
            decoder.activate_search("align")
            decoder.start_utt()
            decoder.process_raw(data, full_utt=True)
            decoder.end_utt()
        except RuntimeError as error:
            raise AlignmentFailed(str(error)) from error
        return list(decoder.seg() or [])

    def _grammar(self, said: list[tuple[str, str]], open_end: bool, pauses: bool):
        """The words' grammar: in order, silence allowed after punctuation, and (open end) an exit after each.

        State 2i is before word i; a pause after word i is the way from state 2i+1 to 2i+2 through
        silence (else a null step)."""
        final = 2 * len(said)
        stay = 1.0 - _EXIT_PROB if open_end else 1.0
        transitions = []
        for i, (entry, word) in enumerate(said):
            transitions.append((2 * i, 2 * i + 1, stay if i else 1.0, entry))
            if pauses and word[-1] in _PAUSING and i < len(said) - 1:
                transitions += [(2 * i + 1, 2 * i + 2, 0.5, "<sil>"), (2 * i + 1, 2 * i + 2, 0.5)]
            else:
                transitions.append((2 * i + 1, 2 * i + 2, 1.0))
            if open_end and 0 < i < len(said) - 1:
                transitions.append((2 * i + 1, final, _EXIT_PROB))
        return self._decoder.create_fsg("align", 0, final, transitions)

    def _word_spans(self, segments, loud: np.ndarray) -> list[tuple[float, float, float]]:
        """The aligned words' (start, end) in seconds, without the pauses PocketSphinx put inside them, and how
        long the sound it gave each word lasts.

        The grammar has silence at most after punctuation (silence between every two words makes
        PocketSphinx lose its way in synthetic speech), so a pause joins a neighbouring word, in part or
        whole: a word whose sound lies after (before) a pause inside it starts (ends) at that pause's end (start).
        """
        spans = []
        for segment in segments:
            if segment.word in ("<s>", "</s>", "<sil>", "(NULL)") or segment.word.startswith("["):
                continue
            first, last = segment.start_frame, min(segment.end_frame, len(loud) - 1)
            sounding = float(loud[first : last + 1].sum()) * _FRAME_S
            pause = _longest_pause(loud[first : last + 1])
            if pause is not None:
                pause_start, pause_end = first + pause[0], first + pause[1]
                if pause_start - first < last + 1 - pause_end:  # mostly sound after it: the word starts after it
                    first = max(first, pause_end - _ONSET_FRAMES)
                else:
                    last = pause_start - 1
            spans.append((first * _FRAME_S, (last + 1) * _FRAME_S, sounding))
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


def _quiet_pauses(segments, loud: np.ndarray) -> bool:
    """Whether the silence PocketSphinx found holds little sound (else it hid words there, lost)."""
    return all(float(loud[s.start_frame : s.end_frame + 1].sum()) * _FRAME_S <= _MAX_PAUSE_SOUND_S
               for s in segments if s.word == "<sil>")


def _longest_pause(loud: np.ndarray) -> tuple[int, int] | None:
    """(start, end) of the longest run of at least `_PAUSE_FRAMES` silent frames, else None."""
    edges = np.flatnonzero(np.diff(np.concatenate(([1], loud.astype(np.int8), [1]))))
    runs = edges.reshape(-1, 2)  # silent runs: [start, end)
    if not len(runs):
        return None
    longest = runs[np.argmax(runs[:, 1] - runs[:, 0])]
    return (int(longest[0]), int(longest[1])) if longest[1] - longest[0] >= _PAUSE_FRAMES else None


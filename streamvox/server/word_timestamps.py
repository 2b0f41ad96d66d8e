"""Word timestamps on the wire: the `word_timestamps` request field, and timings placed in an utterance.

A request that asks for them gets `WordTimings` from the engine after the audio they cover
(`AudioOut.stream()`); routes send them as they come (`speech.audio.timestamps`, `audio.timestamps`).
A model that cannot time its words refuses the field with a 400 naming the flag that enables an
aligner: timings are never guessed.
"""

from __future__ import annotations

import bisect
import re

from streamvox.contract import ModelInfo, WordTimings
from streamvox.server.errors import APIError

_WORD = re.compile(r"\S+")
ALIGNER_FLAG = "--aligner pocketsphinx (English, CPU) or --aligner DIR_OR_REPO (Qwen3-ForcedAligner-0.6B)"


def parse_word_timestamps(body: dict, info: ModelInfo) -> bool:
    """The `word_timestamps` field of a request body or session config (default false)."""
    value = body.get("word_timestamps", False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, "'word_timestamps' must be a boolean.", "word_timestamps")
    if value and not info.word_timestamps:
        raise APIError(400, f"Model '{info.name}' has no word aligner, so it cannot send word timestamps; start the "
                            f"server with {ALIGNER_FLAG} to enable them.", "word_timestamps",
                       "word_timestamps_unavailable")
    return value


class UtteranceTimings:
    """Places the timings of an utterance's engine requests (spoken one after another) in the utterance.

    Each request's timings count seconds from its own first sample and characters in its own text;
    the utterance's count from its first sample and in its whole text (`add_text`). Split into pieces, the
    text's pieces with no letter or digit are spoken by no request: their words take no time where they stand
    (`start_request`, `rest`).
    """

    def __init__(self, sample_rate: int) -> None:
        self.rate = sample_rate
        self.text = ""  # the utterance's text so far
        self.samples = 0  # of the utterance's audio so far
        self.parts: list[WordTimings] = []
        self._cursor = 0  # where the last request's text ended in `text`
        self._request_start = (0, 0)  # (sample, character) where the current request starts

    def add_text(self, text: str) -> None:
        self.text += text

    def start_request(self, text: str | None = None) -> WordTimings | None:
        """A request starts speaking; `text`: its text, verbatim in the utterance's (None: all of it). The words
        before it that no request speaks, if any, timed (and kept for `whole()`)."""
        skipped = None
        if text is None:
            chars = 0
        else:
            found = self.text.find(text, self._cursor)
            chars = found if found >= 0 else self._cursor
            skipped = self._unspoken(chars)
            self._cursor = chars + len(text)
        self._request_start = (self.samples, chars)
        return skipped

    def rest(self) -> WordTimings | None:
        """Once the text is complete: the words after the last request's, which no request speaks, timed."""
        return self._unspoken(len(self.text))

    def _unspoken(self, end: int) -> WordTimings | None:
        start = self._cursor
        spans = [(start + m.start(), start + m.end()) for m in _WORD.finditer(self.text[start:end])]
        self._cursor = end
        if not spans:
            return None
        timings = WordTimings.silent(spans, self.text, self.samples / self.rate)
        self.parts.append(timings)
        return timings

    def audio(self, samples: int) -> None:
        self.samples += samples

    def place(self, timings: WordTimings) -> WordTimings:
        """A request's timings, in the utterance (kept for `whole()`)."""
        samples, chars = self._request_start
        placed = timings.shifted(samples / self.rate, chars) if samples or chars else timings
        self.parts.append(placed)
        return placed

    def whole(self) -> WordTimings:
        return WordTimings.join(self.parts) if self.parts else WordTimings([], [], [], [], [])


def spoken_prefix(text: str, timings: WordTimings, audio_end_s: float) -> str:
    """`text` cut after the last word that started before `audio_end_s` (what a listener heard of it).

    For a truncated reply: `timings` index `text` (`char_start`/`char_end`); "" when no word started.
    """
    heard = bisect.bisect_left(timings.start, audio_end_s)
    return text[: timings.char_end[heard - 1]] if heard else ""

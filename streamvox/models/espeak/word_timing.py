"""Word timings from eSpeak NG's own synthesis events, for one clause at a time.

eSpeak reports a WORD event at the exact sample where it starts speaking a word,
with the word's character position (from 1) in the text it was given. Some words
get no event ("a", the second half of "white-haired", the word after "déjà"),
and a number gives one per spoken word ("1234": "one thousand two hundred
thirty four"). So events are mapped onto the clause's words (its `\\S+` runs):
a word starts at its first event; words without one are spread between their
neighbours in proportion to their letters and digits. A word ends where the
next one starts; the clause's last word ends where its sound does (less the
trailing silence). Each word is reported as the verbatim span of the request's
input, punctuation attached. Words in no clause (pieces the splitter drops for
having no letter or digit, such as "???" or an emoji) take no time: they start
and end where the next clause starts, or, past the last, where the sound ends.
"""

from __future__ import annotations

import bisect
import re

import numpy as np

from streamvox.contract import WordTimings
from streamvox.models.espeak.library import EVENT_WORD, SynthEvent

SILENCE = 300  # |int16 sample| at or below this is silence (about -40 dBFS)
_WORD = re.compile(r"\S+")


def last_sound(samples: np.ndarray) -> int:
    """One past the index of the last sample louder than silence in `samples` (0 if none is)."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > SILENCE)
    return int(loud[-1]) + 1 if len(loud) else 0


class InputWords:
    """Finds each clause's words in the request's whole input text, in order.

    The clause splitter hands eSpeak clauses whose words are the input's words in order (it may
    re-join them with single spaces, and drops pieces with no letter or digit), so each clause
    word is found verbatim at or after where the previous one ended; the input's words passed
    over on the way are those of dropped pieces.
    """

    def __init__(self) -> None:
        self.text = ""
        self._cursor = 0

    def add(self, text: str) -> None:
        self.text += text

    def spans(self, clause: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(the input's words before the clause's that no clause holds, the clause's words), as spans."""
        skipped: list[tuple[int, int]] = []
        spans = []
        for match in _WORD.finditer(clause):
            word = match.group()
            start = self.text.find(word, self._cursor)
            if start < 0:  # cannot happen with the splitter's clauses; keep the order regardless
                start = self._cursor
            if not spans:
                skipped = self._words(self._cursor, start)
            self._cursor = start + len(word)
            spans.append((start, self._cursor))
        return skipped, spans

    def rest(self) -> list[tuple[int, int]]:
        """The words after the last clause's (once the input is complete: those no clause holds)."""
        skipped = self._words(self._cursor, len(self.text))
        self._cursor = len(self.text)
        return skipped

    def _words(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(start + m.start(), start + m.end()) for m in _WORD.finditer(self.text[start:end])]


def silent_timings(spans: list[tuple[int, int]], input_text: str, at: float) -> WordTimings:
    """Timings of words that take no time, all at `at` seconds."""
    return WordTimings(words=[input_text[a:b] for a, b in spans], start=[at] * len(spans), end=[at] * len(spans),
                       char_start=[a for a, _ in spans], char_end=[b for _, b in spans])


def clause_timings(clause: str, spans: list[tuple[int, int]], input_text: str, events: list[SynthEvent],
                   clause_start: int, sound_end: int, sample_rate: int) -> WordTimings:
    """The timings of a clause's words.

    `spans`: each clause word's span in `input_text`; `events`: eSpeak's events for `clause` (samples
    from its start); `clause_start`: the clause's first sample in the request's audio; `sound_end`: one
    past its last audible sample there.
    """
    words = [(m.start(), m.end()) for m in _WORD.finditer(clause)]
    n = len(words)
    ends_in_clause = [end for _, end in words]
    starts: list[int | None] = [None] * n
    for event in events:
        if event.kind != EVENT_WORD:
            continue
        # The word holding the event's first character (or, in the whitespace before a word, that word).
        i = bisect.bisect_right(ends_in_clause, event.text_position - 1)
        if i < n and starts[i] is None:
            starts[i] = clause_start + event.sample
    _fill_gaps(starts, [_spoken_length(clause[a:b]) for a, b in words], clause_start, sound_end)
    known: list[int] = starts  # type: ignore[assignment]  # every entry is set now
    last = max(sound_end, known[-1]) if n else sound_end
    ends = known[1:] + [last]
    rate = float(sample_rate)
    return WordTimings(
        words=[input_text[a:b] for a, b in spans],
        start=[round(s / rate, 4) for s in known],
        end=[round(e / rate, 4) for e in ends],
        char_start=[a for a, _ in spans],
        char_end=[b for _, b in spans],
    )


def _spoken_length(word: str) -> int:
    """A word's weight when it shares time with others: its letters and digits (punctuation is silent)."""
    return sum(ch.isalnum() for ch in word)


def _fill_gaps(starts: list[int | None], lengths: list[int], first: int, after_last: int) -> None:
    """Set the starts that have no event, and keep all of them in order.

    A run of words without an event shares the time between the word before it and the next word
    with an event (the clause's start and its sound's end at the edges), by `lengths`.
    """
    n = len(starts)
    previous = first
    for i, start in enumerate(starts):  # events come in order; keep it so
        if start is not None:
            starts[i] = previous = max(start, previous)
    i = 0
    while i < n:
        if starts[i] is not None:
            i += 1
            continue
        j = i
        while j < n and starts[j] is None:
            j += 1
        # words i..j-1 have no start: the anchor is word i-1's start (or the clause's), the next is j's
        left = starts[i - 1] if i else first
        right = starts[j] if j < n else max(after_last, left)
        weights = lengths[i - 1 : j] if i else [0] + lengths[i:j]
        total = sum(weights) or 1
        done = 0
        for k in range(i, j):
            done += weights[k - i]
            starts[k] = left + (right - left) * done // total
        i = j

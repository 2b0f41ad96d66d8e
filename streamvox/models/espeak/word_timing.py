"""Word timings from eSpeak NG's own synthesis events, for one clause at a time.

eSpeak reports a WORD event at the exact sample where it starts speaking a word,
with the word's character position (from 1) in the text it was given. Some words
get no event ("a", the second half of "white-haired", the word after "déjà"),
and a number gives one per spoken word ("1234": "one thousand two hundred
thirty four"). So events are mapped onto the clause's words (its `\\S+` runs):
a word starts at its first event; words without one are spread between their
neighbours in proportion to their letters and digits. A word ends where the
next one starts; the clause's last word ends where its sound does (less the
trailing silence). A word's timing is sent as soon as that end is known, with
the audio that holds the next word's event, so a request stopped mid-clause keeps
the timings of the words it spoke. Each word is reported as the verbatim span of
the request's input, punctuation attached. Words in no clause (pieces the
splitter drops for having no letter or digit, such as "???" or an emoji) take no
time: they start and end where the next clause starts, or, past the last, where
the last word ended.
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
        """(the input's words before the clause's that no clause holds, the clause's words), as spans.

        The clause is where its words follow each other with only whitespace between: its first word alone
        may also be a word of a dropped piece before it ("😀 ???" before "😀 go.")."""
        words = [match.group() for match in _WORD.finditer(clause)]
        if not words:
            return [], []
        at = self._cursor
        while (start := self.text.find(words[0], at)) >= 0:
            if (spans := self._following(start, words)) is not None:
                break
            at = start + 1
        else:  # cannot happen with the splitter's clauses; keep the order regardless
            start, spans = self._cursor, []
            for word in words:
                found = self.text.find(word, start)
                start = found if found >= 0 else start
                spans.append((start, start + len(word)))
                start += len(word)
            start = spans[0][0]
        skipped = self._words(self._cursor, start)
        self._cursor = spans[-1][1]
        return skipped, spans

    def _following(self, start: int, words: list[str]) -> list[tuple[int, int]] | None:
        """The spans of `words` from `start` on, each after only whitespace; None where they are not so."""
        spans, at = [], start
        for word in words:
            while at < len(self.text) and self.text[at].isspace() and spans:
                at += 1
            if not self.text.startswith(word, at):
                return None
            spans.append((at, at + len(word)))
            at += len(word)
        return spans

    def rest(self) -> list[tuple[int, int]]:
        """The words after the last clause's (once the input is complete: those no clause holds)."""
        skipped = self._words(self._cursor, len(self.text))
        self._cursor = len(self.text)
        return skipped

    def _words(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(start + m.start(), start + m.end()) for m in _WORD.finditer(self.text[start:end])]


def _timings(spans: list[tuple[int, int]], input_text: str, start: list[float], end: list[float]) -> WordTimings:
    """The words at `spans` of `input_text`, timed from `start` to `end` (seconds)."""
    return WordTimings(words=[input_text[a:b] for a, b in spans], start=start, end=end,
                       char_start=[a for a, _ in spans], char_end=[b for _, b in spans])


class ClauseWords:
    """One clause's word timings, sent as eSpeak's events come: a word as soon as the next one's start (its
    end) is known, the last at the clause's end. A request stopped mid-clause keeps the timings of the words
    already heard."""

    def __init__(self, clause: str, spans: list[tuple[int, int]], input_text: str, clause_start: int,
                 sample_rate: int) -> None:
        """`spans`: each clause word's span in `input_text`; `clause_start`: the clause's first sample in the
        request's audio."""
        words = [(m.start(), m.end()) for m in _WORD.finditer(clause)]
        self._ends_in_clause = [end for _, end in words]
        self._lengths = [_spoken_length(clause[a:b]) for a, b in words]
        self._spans = spans
        self._text = input_text
        self._start = clause_start
        self._rate = float(sample_rate)
        self._first_event: list[int | None] = [None] * len(words)  # each word's first event's sample
        self._fixed: list[int] = []  # the starts that can no longer change: the sent words' and the next one's
        self._sent = 0  # words sent

    def event(self, event: SynthEvent) -> None:
        """One of eSpeak's events for the clause (its sample counted from the clause's start)."""
        if event.kind != EVENT_WORD:
            return
        # The word holding the event's first character (or, in the whitespace before a word, that word).
        i = bisect.bisect_right(self._ends_in_clause, event.text_position - 1)
        if len(self._fixed) <= i < len(self._first_event) and self._first_event[i] is None:
            self._first_event[i] = self._start + event.sample

    def ready(self) -> WordTimings | None:
        """The words not yet sent whose ends are known now, if any."""
        known = [i for i in range(len(self._fixed), len(self._first_event)) if self._first_event[i] is not None]
        if not known:
            return None
        last = known[-1]
        self._fixed = self._filled(last + 1, 0)
        return self._take(last, self._fixed[1:]) if last > self._sent else None

    def end(self, sound_end: int) -> WordTimings | None:
        """The words not yet sent, the clause's sound having ended at sample `sound_end`."""
        n = len(self._first_event)
        if self._sent == n:
            return None
        self._fixed = self._filled(n, sound_end)
        return self._take(n, self._fixed[1:] + [max(sound_end, self._fixed[-1])])

    def _filled(self, count: int, after_last: int) -> list[int]:
        """The first `count` words' starts: the fixed ones, then the events', the gaps filled."""
        starts = self._fixed + self._first_event[len(self._fixed) : count]
        _fill_gaps(starts, self._lengths[:count], self._start, after_last)
        return starts  # type: ignore[return-value]  # every entry is set now

    def _take(self, upto: int, ends: list[int]) -> WordTimings:
        """Words `_sent` to `upto` (not included), word i ending at `ends[i]`; they are sent."""
        first, self._sent = self._sent, upto
        start, end = ([round(t / self._rate, 4) for t in samples[first:upto]] for samples in (self._fixed, ends))
        return _timings(self._spans[first:upto], self._text, start, end)


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

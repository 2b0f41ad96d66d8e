"""The one splitter of text into sentences or clauses, for text that is whole or still arriving.

eSpeak speaks a request clause by clause as its text arrives, and the speech-stream route's
`text_split` modes make one engine request per sentence or clause; both cut here.

A sentence ends at `.`, `!` or `?` followed by whitespace, at the CJK full stop, exclamation or
question mark (no space needed: CJK text has none), and at a line break. A clause also ends at
`;`, `:` or `,` followed by whitespace and at the CJK comma, semicolon, colon or enumeration comma.
Pieces are stripped of surrounding whitespace; a piece with no letter or digit is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MODES = ("sentence", "clause")

_ENDS = {
    "sentence": re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])|\n+"),
    "clause": re.compile(r"(?<=[.!?;:,])\s+|(?<=[\u3002\uff01\uff1f\uff0c\uff1b\uff1a\u3001])|\n+"),
}


def _pattern(mode: str) -> re.Pattern[str]:
    try:
        return _ENDS[mode]
    except KeyError:
        raise ValueError(f"unknown split mode {mode!r}; expected one of {MODES}") from None


def _pieces(text: str, pattern: re.Pattern[str], max_words: int | None) -> Iterator[str]:
    for part in pattern.split(text):
        if max_words is None:
            runs = [part.strip()]
        else:
            words = part.split()
            runs = [" ".join(words[start : start + max_words]) for start in range(0, len(words), max_words)]
        yield from (run for run in runs if any(ch.isalnum() for ch in run))


def split_text(text: str, mode: str = "sentence", max_words: int | None = None) -> list[str]:
    """Cut a whole text into sentences or clauses (`mode`, one of `MODES`).

    With `max_words`, a longer piece is cut into runs of at most that many words, and each piece
    is its words joined by single spaces.
    """
    return list(_pieces(text, _pattern(mode), max_words))


class TextSplitter:
    """Cuts text that arrives in parts into complete sentences or clauses; the unfinished tail waits.

    `add(text, final)` returns the pieces completed so far; the pieces of all calls together are
    those of `split_text` on the whole text.
    """

    def __init__(self, mode: str = "sentence", max_words: int | None = None) -> None:
        self.pattern = _pattern(mode)
        self.max_words = max_words
        self.pending = ""

    def add(self, text: str, final: bool = False) -> list[str]:
        """Append `text`; with `final`, the text is complete and its tail is returned too."""
        self.pending += text
        if final:
            complete, self.pending = self.pending, ""
        else:
            ends = [match.end() for match in self.pattern.finditer(self.pending) if match.end() > 0]
            if not ends:
                return []
            complete, self.pending = self.pending[: ends[-1]], self.pending[ends[-1] :]
        return list(_pieces(complete, self.pattern, self.max_words))

"""What the aligner is asked, and how its answer becomes times.

Each whitespace-separated word keeps only its letters, digits and apostrophes (a word left empty,
such as "-", is not asked about), and CJK ideographs stand alone, each a unit of its own. The
prompt is plain, with no chat template: the audio, then every unit followed by two `<timestamp>`
markers (its start and its end). The class predicted at a marker counts `segment_ms` steps. Times
that go backwards are repaired as the reference does: the longest non-decreasing run is kept, a gap
of one or two is filled from its nearer kept neighbour, a longer gap is interpolated.
"""

from __future__ import annotations

import functools
import unicodedata

AUDIO_START = "<|audio_start|>"
AUDIO_PAD = "<|audio_pad|>"
AUDIO_END = "<|audio_end|>"
TIMESTAMP = "<timestamp>"


def _kept(ch: str) -> bool:
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
            or 0x2A700 <= code <= 0x2B73F or 0x2B740 <= code <= 0x2B81F or 0x2B820 <= code <= 0x2CEAF
            or 0xF900 <= code <= 0xFAFF)


@functools.lru_cache(maxsize=1 << 16)  # words recur from request to request
def units(word: str) -> tuple[str, ...]:
    """The units the aligner times for one whitespace-separated word (none for punctuation alone)."""
    out, run = [], ""
    for ch in (ch for ch in word if _kept(ch)):
        if _is_cjk(ch):
            if run:
                out.append(run)
                run = ""
            out.append(ch)
        else:
            run += ch
    return tuple(out + [run] if run else out)


def prompt_text(unit_list: list[str]) -> str:
    """The text after the audio block: each unit followed by its two markers."""
    return "".join(unit + TIMESTAMP + TIMESTAMP for unit in unit_list)


def repaired(values: list[float]) -> list[int]:
    """Marker times (ms) made non-decreasing (see the module docstring); whole milliseconds, truncated."""
    n = len(values)
    if not n:
        return []
    length, parent = [1] * n, [-1] * n
    for i in range(1, n):
        for j in range(i):
            if values[j] <= values[i] and length[j] + 1 > length[i]:
                length[i], parent[i] = length[j] + 1, j
    kept = [False] * n
    k = length.index(max(length))
    while k != -1:
        kept[k] = True
        k = parent[k]
    out = list(values)
    i = 0
    while i < n:
        if kept[i]:
            i += 1
            continue
        j = i
        while j < n and not kept[j]:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if kept[k]), None)
        right = next((out[k] for k in range(j, n) if kept[k]), None)
        for k in range(i, j):
            if left is None or right is None:
                out[k] = right if left is None else left
            elif j - i <= 2:
                out[k] = left if k - (i - 1) <= j - k else right
            else:
                out[k] = left + (right - left) / (j - i + 1) * (k - i + 1)
        i = j
    return [int(v) for v in out]


def word_spans(words: list[str], marker_ms: list[int]) -> list[tuple[float, float]]:
    """(start, end) in seconds for each word from its units' repaired marker times; a word with no unit
    gets an empty span where the previous word ended."""
    spans, unit, previous_end = [], 0, 0.0
    for word in words:
        count = len(units(word))
        if not count:
            spans.append((previous_end, previous_end))
            continue
        start = round(marker_ms[2 * unit] / 1000.0, 3)
        end = round(marker_ms[2 * (unit + count) - 1] / 1000.0, 3)
        spans.append((start, end))
        unit += count
        previous_end = end
    return spans

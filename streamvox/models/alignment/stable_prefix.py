"""When a word timing from a partial alignment can be trusted: the stable-prefix ("local agreement") rule.

While a request speaks, its audio so far is aligned with its text so far every `STEP_S` seconds.
The text may run ahead of the audio, and the audio's tail may stop mid-word, so the last words of a
partial alignment are squeezed or cut. A word is committed (its timing sent, never revised) only
when two partial alignments in a row agree on its start, as do all the words before it, and it ends
at least `GUARD_S` before the aligned audio does.
"""

from __future__ import annotations

from streamvox.models.alignment.word_aligner import Spans

STEP_S = 1.5  # new audio between two partial alignments of a request
AGREE_S = 0.04  # two starts of a word this close agree
GUARD_S = 0.5  # a committed word ends at least this long before the aligned audio


def shifted(spans: Spans, seconds: float) -> Spans:
    """`spans` of audio that starts `seconds` into the request, in seconds from the request's first sample."""
    return [(start + seconds, end + seconds) for start, end in spans]


def bounded(spans: Spans, floor: float, ceiling: float) -> Spans:
    """`spans` kept within [floor, ceiling] and in order: no start before the previous one, no end before its
    start."""
    out: Spans = []
    last = floor
    for start, end in spans:
        start = min(max(start, last), ceiling)
        end = min(max(end, start), ceiling)
        out.append((start, end))
        last = start
    return out


def stable_count(spans: Spans, previous: dict[int, float], first: int, audio_end: float,
                 agree: float = AGREE_S, guard: float = GUARD_S) -> int:
    """How many of `spans` (of words `first`, `first` + 1, ...; times from the request's first sample) to
    commit: the longest prefix whose starts are within `agree` of `previous` (word index -> its start in the
    previous partial alignment) and whose ends lie `guard` or more before `audio_end`."""
    count = 0
    for i, (start, end) in enumerate(spans):
        before = previous.get(first + i)
        if before is None or abs(start - before) > agree or end > audio_end - guard:
            break
        count += 1
    return count


def uncommitted_starts(spans: Spans, first: int, committed: int) -> dict[int, float]:
    """What the next partial alignment is compared with: the starts of the words not committed (word index ->
    start), `committed` of `spans` having been."""
    return {first + i: start for i, (start, _) in enumerate(spans) if i >= committed}

"""The stable-prefix commit rule: a partial alignment's word is committed only where it agrees with the last one."""

from __future__ import annotations

import pytest

from streamvox.models.alignment.stable_prefix import (
    AGREE_S,
    GUARD_S,
    bounded,
    shifted,
    stable_count,
    uncommitted_starts,
)


def test_the_prefix_whose_starts_agree_is_committed():
    previous = {0: 1.0, 1: 1.5, 2: 2.0, 3: 2.4}
    spans = [(1.0 + AGREE_S / 2, 1.4), (1.5 + AGREE_S * 1.5, 1.9), (2.0, 2.3), (2.4, 2.6)]
    assert stable_count(spans, previous, 0, audio_end=10.0) == 1  # the second moved: it and all after wait
    assert stable_count(spans[:1], previous, 0, audio_end=10.0) == 1
    assert stable_count([(1.5, 1.9)] + spans[2:], previous, 1, audio_end=10.0) == 3


def test_words_are_matched_by_their_index_in_the_request():
    previous = {5: 3.0, 6: 3.4}  # words 0-4 committed earlier
    assert stable_count([(3.0, 3.3), (3.4, 3.8)], previous, 5, audio_end=10.0) == 2
    assert stable_count([(3.0, 3.3), (3.4, 3.8)], previous, 4, audio_end=10.0) == 0  # no earlier start for 4
    assert stable_count([(3.0, 3.3)], {}, 5, audio_end=10.0) == 0  # the first partial commits nothing


def test_words_near_the_audio_end_wait_however_well_they_agree():
    previous = {0: 0.1, 1: 0.6, 2: 1.1}
    spans = [(0.1, 0.5), (0.6, 1.0), (1.1, 1.45)]
    assert stable_count(spans, previous, 0, audio_end=1.0 + GUARD_S) == 2  # word 1 ends exactly at the guard
    assert stable_count(spans, previous, 0, audio_end=0.9 + GUARD_S) == 1
    assert stable_count(spans, previous, 0, audio_end=0.4) == 0


def test_spans_are_moved_to_the_request_time_axis():
    assert shifted([(0.0, 0.3), (0.3, 0.8)], 2.5) == [(2.5, 2.8), (2.8, 3.3)]


def test_bounded_spans_are_monotone_and_within_the_audio():
    spans = bounded([(0.9, 1.2), (1.1, 1.0), (2.0, 9.0), (1.5, 1.6)], floor=1.0, ceiling=3.0)
    assert spans == [(1.0, 1.2), (1.1, 1.1), (2.0, 3.0), (2.0, 2.0)]
    starts = [s for s, _ in spans]
    assert starts == sorted(starts) and all(1.0 <= s <= e <= 3.0 for s, e in spans)


def test_only_the_uncommitted_words_are_remembered():
    spans = [(1.0, 1.2), (1.2, 1.6), (1.6, 2.0)]
    assert uncommitted_starts(spans, 4, 1) == {5: 1.2, 6: 1.6}
    assert uncommitted_starts(spans, 4, 3) == {}


@pytest.mark.parametrize("moved", [0.0, AGREE_S * 0.9, -AGREE_S * 0.9])
def test_agreement_is_within_the_tolerance_either_way(moved):
    assert stable_count([(1.0 + moved, 1.2)], {0: 1.0}, 0, audio_end=5.0) == 1
    assert stable_count([(1.0 + moved * 2 + AGREE_S * (1 if moved >= 0 else -1), 1.2)], {0: 1.0}, 0,
                        audio_end=5.0) == 0

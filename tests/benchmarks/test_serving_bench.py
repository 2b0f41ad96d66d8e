"""The serving benchmark's playback model: what it counts as a stall."""

from __future__ import annotations

import pytest

from benchmarks.serving_bench import Playback

RATE = 24000
SECOND = 2 * RATE  # bytes of s16le mono audio


def test_audio_ahead_of_playback_never_stalls() -> None:
    p = Playback(RATE)
    p.add(10.0, SECOND // 2)  # plays from 10.0 to 10.5
    p.add(10.2, SECOND // 2)  # arrives early: plays on to 11.0
    p.add(11.0, SECOND)  # just in time
    assert p.stall == 0.0
    assert p.until == pytest.approx(12.0)


def test_late_audio_counts_the_wait_and_playback_resumes_from_it() -> None:
    p = Playback(RATE)
    p.add(0.0, 0)  # empty chunks neither start playback nor count
    p.add(1.0, SECOND // 4)  # first audio: playback starts at 1.0, runs out at 1.25
    p.add(1.5, SECOND // 4)  # 0.25 s late; plays 1.5 to 1.75
    p.add(2.0, SECOND)  # 0.25 s late again
    assert p.stall == pytest.approx(0.5)
    assert p.until == pytest.approx(3.0)

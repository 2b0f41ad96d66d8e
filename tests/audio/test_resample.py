"""Streaming resampling: chunk boundaries leave no trace, and the same rate passes audio through."""

from __future__ import annotations

import numpy as np

from streamvox.audio.resample import Resampler


def _tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_resampling_in_chunks_equals_resampling_in_one_piece():
    pcm = _tone(22050, 1.0)
    whole = Resampler(22050, 24000)
    expected = np.concatenate([whole.process(pcm), whole.flush()])
    chunked = Resampler(22050, 24000)
    parts = [chunked.process(pcm[start : start + 1234]) for start in range(0, len(pcm), 1234)]
    actual = np.concatenate([*parts, chunked.flush()])
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    assert abs(len(actual) - 24000) <= 1
    assert chunked.produced == len(actual)


def test_same_rate_passes_audio_through():
    pcm = _tone(16000, 0.1)
    resampler = Resampler(16000, 16000)
    assert np.array_equal(resampler.process(pcm), pcm)
    assert len(resampler.flush()) == 0
    assert resampler.produced == len(pcm)

"""Streaming time stretch: exact length, the same audio however the input is split, pitch kept, cheap."""

from __future__ import annotations

import time

import numpy as np
import pytest

from streamvox.audio.time_stretch import TimeStretcher

RATE = 24000


def _voice_like(seconds: float) -> np.ndarray:
    """A 200 Hz tone with harmonics, syllable-rate loudness changes and a little noise."""
    t = np.arange(int(seconds * RATE)) / RATE
    tone = sum(np.sin(2 * np.pi * 200 * k * t) / k for k in (1, 2, 3))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    noise = 0.01 * np.random.default_rng(3).standard_normal(t.size)
    return (0.2 * tone * envelope + noise).astype(np.float32)


def _stretch(pcm: np.ndarray, speed: float, sizes: list[int]) -> np.ndarray:
    stretcher, parts, start, i = TimeStretcher(RATE, speed), [], 0, 0
    while start < len(pcm):
        size = sizes[i % len(sizes)]
        parts.append(stretcher.process(pcm[start:start + size]))
        start, i = start + size, i + 1
    parts.append(stretcher.flush())
    return np.concatenate(parts)


def _dominant_hz(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.fft.rfftfreq(len(pcm), 1 / RATE)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.5, 2.0, 4.0])
def test_length_is_input_over_speed_and_pitch_is_kept(speed):
    pcm = _voice_like(2.3)
    out = _stretch(pcm, speed, [3840])
    assert len(out) == round(len(pcm) / speed)
    middle = out[len(out) // 4: 3 * len(out) // 4]
    assert abs(_dominant_hz(middle) - 200) < 5  # the pitch stays; only the tempo changes
    assert np.sqrt(np.mean(middle ** 2)) > 0.3 * np.sqrt(np.mean(pcm ** 2))  # not silence


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_output_does_not_depend_on_how_the_input_is_split(speed):
    pcm = _voice_like(3.0)
    whole = _stretch(pcm, speed, [len(pcm)])
    for sizes in ([3840, 48000], [1, 333, 5000], [512]):
        assert np.array_equal(_stretch(pcm, speed, sizes), whole), sizes


def test_a_stream_without_input_is_empty():
    assert len(TimeStretcher(RATE, 2.0).flush()) == 0


def test_it_costs_little_cpu_per_second_of_audio():
    pcm = _voice_like(5.0)
    start = time.process_time()
    _stretch(pcm, 0.5, [4800])
    per_audio_second = (time.process_time() - start) / 5.0
    assert per_audio_second < 0.2, f"{per_audio_second:.3f} s of CPU per second of audio"  # measured ~0.015

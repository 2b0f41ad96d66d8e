"""The aligner's features from audio at any rate: resampled on the device as soxr's HQ filter (the reference's)
resamples it, to within what changes no feature that matters."""

from __future__ import annotations

import numpy as np
import pytest
import soxr
import torch

from streamvox.models.alignment.qwen3_aligner.config import FeatureConfig
from streamvox.models.alignment.qwen3_aligner.features import log_mel_batch, resampled, resampled_length
from streamvox.models.espeak.library import EspeakLibrary

CFG = FeatureConfig()


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, int]:
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    parts: list[np.ndarray] = []
    espeak.synthesize("Captions need 42 word timings, and barge-in needs the words that were heard.",
                      lambda pcm: parts.append(pcm) or True)
    return np.concatenate(parts).astype(np.float32) / 32768.0, espeak.sample_rate


@pytest.mark.parametrize("rate", [22050, 24000, 48000, 8000])
def test_resampling_agrees_with_soxr_hq(speech, rate):
    pcm, espeak_rate = speech
    x = pcm if rate == espeak_rate else soxr.resample(pcm, espeak_rate, rate, quality="VHQ").astype(np.float32)
    reference = soxr.resample(x, rate, CFG.sampling_rate, quality="HQ").astype(np.float32)
    ours = resampled(torch.from_numpy(x)[None], rate, CFG.sampling_rate)[0].numpy()
    assert len(ours) == len(reference)
    snr = 10 * np.log10(np.sum(reference**2) / np.sum((reference - ours) ** 2))
    assert snr > 45  # they differ only in the last few hundred Hz below 8 kHz, where the filters roll off
    expected, frames = log_mel_batch([reference], CFG)
    features, our_frames = log_mel_batch([x], CFG, rates=[rate])
    assert our_frames == frames
    difference = (features - expected).abs()
    assert difference.mean() < 1e-3 and difference.max() < 0.1  # the features span about [-1, 1]


def test_a_tone_passes_unchanged_and_its_phase_is_kept():
    t = np.arange(24000) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    out = resampled(torch.from_numpy(tone)[None], 24000, 16000)[0].numpy()
    expected = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(len(out)) / 16000)
    assert np.abs(out - expected)[200:-200].max() < 1e-4  # away from the clip's edges


def test_lengths_are_soxrs():
    for samples in (400, 1001, 22050, 64118, 64120):
        for rate in (8000, 22050, 24000, 44100, 48000):
            expected = len(soxr.resample(np.zeros(samples, np.float32), rate, CFG.sampling_rate, quality="HQ"))
            assert resampled_length(samples, rate, CFG.sampling_rate) == expected


def test_a_batch_of_mixed_rates_is_resampled_clip_by_clip(speech):
    pcm, rate = speech
    short = pcm[: len(pcm) // 2]
    other = np.asarray(soxr.resample(pcm, rate, CFG.sampling_rate, quality="VHQ"), np.float32)
    at_16k = resampled(torch.from_numpy(short)[None], rate, CFG.sampling_rate)[0].numpy()
    mixed, frames = log_mel_batch([short, other], CFG, rates=[rate, CFG.sampling_rate])
    expected, expected_frames = log_mel_batch([at_16k, other], CFG)
    assert frames == expected_frames
    torch.testing.assert_close(mixed, expected, atol=1e-5, rtol=1e-5)


def test_louder_than_full_scale_is_scaled_down_by_its_peak(speech):
    pcm, rate = speech
    loud = 3.0 * pcm / np.abs(pcm).max()
    wave = resampled(torch.from_numpy(loud)[None], rate, CFG.sampling_rate)[0]
    expected, _ = log_mel_batch([(wave / wave.abs().max()).numpy()], CFG)  # the peak after resampling
    features, _ = log_mel_batch([loud], CFG, rates=[rate])
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)
    quiet, _ = log_mel_batch([loud / 4], CFG, rates=[rate])  # under full scale: left as it is
    assert (quiet - features).mean() < -0.05

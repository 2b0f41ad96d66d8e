"""Whisper-style log-mel features of a batch of 16 kHz clips, as the aligner's feature extractor makes them.

A batch is zero-padded to its longest clip before the STFT (centred, reflect-padded, Hann window),
so a clip's last frame or two see the padding, as in the reference processor. Each clip's spectrum is
clamped to 8 (log10) below its own peak and scaled to about [-1, 1]. A clip of n samples has
min(ceil(n / hop), longest // hop) valid frames.
"""

from __future__ import annotations

import numpy as np
import torch

from streamvox.models.alignment.qwen3_aligner.config import FeatureConfig
from streamvox.models.qwen3_tts.speaker import slaney_mel_filterbank

_TOP_HZ = 8000.0  # the filterbank's top edge (Whisper's, whatever the rate)


def peak_normalised(pcm: np.ndarray) -> np.ndarray:
    """Float32 audio in [-1, 1]: audio louder than full scale is scaled down by its peak, as the reference does."""
    audio = np.asarray(pcm, dtype=np.float32)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:
        audio = audio / peak
    return np.clip(audio, -1.0, 1.0)


def log_mel_batch(
    clips: list[np.ndarray], cfg: FeatureConfig, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, list[int]]:
    """`clips` (float32 at `cfg.sampling_rate`) -> features `[B, n_mels, frames]` (float32, computed on
    `device`) and each clip's count of valid frames."""
    longest = max(len(clip) for clip in clips)
    waves = torch.zeros(len(clips), longest, dtype=torch.float32)
    for row, clip in enumerate(clips):
        waves[row, : len(clip)] = torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32))
    waves = waves.to(device)
    window = torch.hann_window(cfg.n_fft, device=waves.device)
    stft = torch.stft(waves, cfg.n_fft, cfg.hop_length, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = slaney_mel_filterbank(cfg.sampling_rate, cfg.n_fft, cfg.feature_size, 0.0, _TOP_HZ)
    filters = torch.from_numpy(filters).to(waves.device)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    log_spec = (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0
    frames = longest // cfg.hop_length
    lengths = [min(-(-len(clip) // cfg.hop_length), frames) for clip in clips]
    return log_spec, lengths

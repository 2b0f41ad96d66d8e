"""Mel front end of the x-vector speaker encoder (24 kHz, 128 log-mel bins).

The filterbank is the Slaney-style one (Slaney mel scale, area-normalised
triangles) that upstream takes from librosa; it is computed here in numpy so
librosa is not needed at run time.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

_F_SP = 200.0 / 3.0  # Hz per mel below the log break
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    lin = f / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(f, 1e-10) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    lin = m * _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log, lin)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """`[n_mels, n_fft // 2 + 1]` float32 triangular filters on the Slaney mel scale."""
    bins = np.linspace(0.0, sr / 2.0, 1 + n_fft // 2)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2))
    widths = np.diff(edges)
    dist = edges[:, None] - bins[None, :]
    fb = np.zeros((n_mels, len(bins)), dtype=np.float32)
    for i in range(n_mels):
        rising = -dist[i] / widths[i]
        falling = dist[i + 2] / widths[i + 1]
        fb[i] = np.maximum(0.0, np.minimum(rising, falling))
    fb *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, None]
    return fb


def log_mel(
    wav: torch.Tensor,
    sr: int = 24000,
    n_fft: int = 1024,
    n_mels: int = 128,
    hop: int = 256,
    win: int = 1024,
    fmin: float = 0.0,
    fmax: float = 12000.0,
) -> torch.Tensor:
    """wav `[B, N]` float -> log-mel `[B, frames, n_mels]` (reflect-padded, un-centred STFT magnitude)."""
    fb = torch.from_numpy(slaney_mel_filterbank(sr, n_fft, n_mels, fmin, fmax)).to(wav.device)
    pad = (n_fft - hop) // 2
    x = torch.nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        x, n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win, device=wav.device),
        center=False, normalized=False, onesided=True, return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(fb, mag)
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)


def resample(pcm: np.ndarray, sr: int, target: int) -> np.ndarray:
    """High-quality resampling with soxr (the same library and quality upstream uses via librosa)."""
    if sr == target:
        return pcm.astype(np.float32)
    import soxr

    return soxr.resample(pcm.astype(np.float32), sr, target, quality="HQ").astype(np.float32)

"""Whisper-style log-mel features of a batch of clips, as the aligner's feature extractor makes them, all on the device.

Clips at another rate are first resampled to the feature rate there, by a polyphase Kaiser-windowed sinc filter
(`_ZEROS`, `_PASSBAND`, `_BETA`, chosen to match soxr's HQ filter, which the reference uses on the CPU: that took
longer for a batch of sixteen 3 s clips than the aligner's whole forward on an H100).
Each clip is then scaled down by its peak if louder than full scale, as the reference does.

A batch is zero-padded to its longest clip before the STFT (centred, reflect-padded, Hann window),
so a clip's last frame or two see the padding, as in the reference processor. Each clip's spectrum is
clamped to 8 (log10) below its own peak and scaled to about [-1, 1]. A clip of n samples has
min(ceil(n / hop), longest // hop) valid frames.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from streamvox.models.alignment.qwen3_aligner.config import FeatureConfig
from streamvox.models.qwen3_tts.speaker import slaney_mel_filterbank

_TOP_HZ = 8000.0  # the filterbank's top edge (Whisper's, whatever the rate)
_ZEROS = 64  # the resampling filter's zero crossings on each side
_PASSBAND = 0.955  # its cutoff, as a share of the lower Nyquist frequency
_BETA = 10.0  # its Kaiser window's shape (about -100 dB sidelobes)


@functools.lru_cache(maxsize=8)
def _polyphase(rate: int, target: int, device: torch.device) -> tuple[torch.Tensor, int, int, int]:
    """The resampling filter from `rate` to `target` Hz as `up` phases `[taps, up]` over input windows that
    start `width` samples before each step of `down` input samples (`rate / target` = `down / up`), on `device`."""
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    band = _PASSBAND * min(1.0, up / down)  # the cutoff in cycles per two input samples
    width = math.ceil(_ZEROS / band)
    t = torch.arange(-width, width + down, dtype=torch.float64)[None, :] - torch.arange(up)[:, None] * down / up
    inside = (1 - (t / width) ** 2).clamp(min=0)
    window = torch.special.i0(_BETA * inside.sqrt()) / torch.special.i0(torch.tensor(_BETA, dtype=torch.float64))
    return (band * torch.sinc(band * t) * window).float().T.contiguous().to(device), up, down, width


def resampled(waves: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """`waves` `[B, n]` at `rate` Hz -> `[B, resampled_length(n)]` at `target` Hz."""
    if rate == target:
        return waves
    kernel, up, down, width = _polyphase(rate, target, waves.device)
    rows, n = waves.shape
    windows = F.pad(waves, (width, width + down)).unfold(1, kernel.shape[0], down)  # [B, steps, taps]
    # a float32 matmul (a cuDNN convolution would run it in TF32 on CUDA)
    phases = windows @ kernel  # [B, steps, up]
    return phases.reshape(rows, -1)[:, : resampled_length(n, rate, target)]


def resampled_length(samples: int, rate: int, target: int) -> int:
    """Samples at `target` Hz of `samples` at `rate` Hz, rounded to the nearest (as soxr counts them)."""
    return (2 * samples * target + rate) // (2 * rate)


@functools.lru_cache(maxsize=4)
def _filters(cfg: FeatureConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hann window and the mel filterbank, on `device`."""
    filters = slaney_mel_filterbank(cfg.sampling_rate, cfg.n_fft, cfg.feature_size, 0.0, _TOP_HZ)
    return torch.hann_window(cfg.n_fft, device=device), torch.from_numpy(filters).to(device)


def log_mel_batch(
    clips: list[np.ndarray], cfg: FeatureConfig, device: torch.device | str = "cpu", rates: list[int] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """`clips` (float32, at `rates` Hz, or all at `cfg.sampling_rate`) -> features `[B, n_mels, frames]` (float32,
    computed on `device`) and each clip's count of valid frames."""
    device = torch.device(device)
    target = cfg.sampling_rate
    rates = rates or [target] * len(clips)
    sizes = [resampled_length(len(clip), rate, target) for clip, rate in zip(clips, rates, strict=True)]
    longest = max(sizes)
    waves = torch.zeros(len(clips), longest, device=device)
    for rate in sorted(set(rates)):
        rows = [i for i, r in enumerate(rates) if r == rate]
        # staged in pinned memory on CUDA: the copy to the device then runs without the host waiting for it (only
        # the rows' padding is zeroed: clearing the whole buffer first doubled the host's time here)
        group = torch.empty(len(rows), max(len(clips[i]) for i in rows), pin_memory=device.type == "cuda")
        for k, i in enumerate(rows):
            group[k, : len(clips[i])] = torch.from_numpy(np.ascontiguousarray(clips[i], dtype=np.float32))
            group[k, len(clips[i]) :] = 0.0
        out = resampled(group.to(device, non_blocking=True), rate, target)[:, :longest]
        # a clip's own samples only: resampling rings past its end into the batch's padding
        own = torch.arange(out.shape[1], device=device) < torch.tensor([sizes[i] for i in rows], device=device)[:, None]
        waves[rows, : out.shape[1]] = out * own
    peak = waves.abs().amax(dim=1, keepdim=True)  # louder than full scale: scaled down by its peak
    waves = torch.where(peak > 1.0, waves / peak, waves).clamp(-1.0, 1.0)
    window, filters = _filters(cfg, device)
    stft = torch.stft(waves, cfg.n_fft, cfg.hop_length, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    log_spec = (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0
    frames = longest // cfg.hop_length
    return log_spec, [min(-(-size // cfg.hop_length), frames) for size in sizes]

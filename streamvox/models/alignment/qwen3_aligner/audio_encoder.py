"""The Qwen3-ASR audio tower: log-mel frames in, one embedding per 80 ms out.

The mel frames are cut into chunks of `2 * n_window` frames (100: 1 s); three stride-2 convolutions
turn each chunk into 13 positions, which get a sinusoidal position embedding that restarts at every
chunk. A transformer encoder then attends within windows of `n_window_infer // (2 * n_window)` chunks
(8 s), never across clips or windows; all the windows of a batch run as one padded batch.
`forward_padded` is the same computation with shapes fixed by the batch's padding alone (no host
syncs, no data-dependent shapes), so it can be captured as a CUDA graph: there each clip's positions
attend as one row, its windows kept apart by a block-diagonal mask. Parameter names are the
checkpoint's (`conv2d1`, `layers.0.self_attn.q_proj`, `ln_post`, `proj2`, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from streamvox.models.alignment.qwen3_aligner.config import AudioEncoderConfig
from streamvox.models.qwen3_tts.model.layers import activation


def conv_length(frames):
    """Positions the three stride-2 convolutions make of `frames` mel frames (an int, or a tensor of them)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def encoded_length(frames, chunk: int):
    """Positions the tower makes of a clip of `frames` mel frames (an int, or a tensor of them), cut into chunks
    of `chunk` frames."""
    return frames // chunk * conv_length(chunk) + conv_length(frames % chunk)  # conv_length(0) is 0


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """`[length, channels]`: sines then cosines of geometrically spaced frequencies (Whisper's table)."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2).float())
    scaled = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class EncoderAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x `[W, L, dim]` (windows, or padded rows), mask broadcastable to `[W, 1, L, L]` (True: attend)."""
        w, length, dim = x.shape
        q, k, v = (proj(x).view(w, length, self.heads, -1).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(w, length, dim))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(cfg.d_model, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.act = activation(cfg.activation_function)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), mask)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hidden = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv_out = nn.Linear(hidden * conv_length(cfg.num_mel_bins), cfg.d_model, bias=False)
        self.layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.encoder_layers)])
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.act = activation(cfg.activation_function)
        self.register_buffer("positions", sinusoids(cfg.max_source_positions, cfg.d_model), persistent=False)

    @property
    def chunk(self) -> int:
        return 2 * self.cfg.n_window

    def forward(self, features: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
        """features `[B, n_mels, frames]`, each clip's valid frames -> each clip's embeddings `[n_i, output_dim]`."""
        chunk = self.chunk
        pieces, valid = [], []
        for row, frames in enumerate(lengths):
            for start in range(0, frames, chunk):
                size = min(chunk, frames - start)
                piece = features[row, :, start : start + size]
                pieces.append(F.pad(piece, (0, chunk - size)) if size < chunk else piece)
                valid.append(conv_length(size))
        x = self._downsample(torch.stack(pieces).unsqueeze(1))
        steps = x.shape[1]
        x = x + self.positions[:steps].to(x.dtype)
        keep = torch.arange(steps, device=x.device)[None, :] < torch.tensor(valid, device=x.device)[:, None]
        flat = x[keep]  # the real positions of every chunk, clip after clip
        sizes = [encoded_length(frames, chunk) for frames in lengths]
        h = self._encode(flat, sizes)
        return list(self.proj2(self.act(self.proj1(self.ln_post(h)))).split(sizes))

    def forward_padded(self, features: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features `[B, n_mels, C * chunk]`, each clip's valid frames `[B]` (on the device) -> embeddings
        `[B, C * positions_per_chunk, output_dim]`, of which each clip's first `lengths[b]` are its own, and
        `lengths` `[B]`. Frames past a clip's own are ignored. Each row's positions attend as one sequence
        under a block-diagonal mask of its windows, so a clip is padded to whole chunks, not whole windows."""
        b, mels, total = features.shape
        chunk = self.chunk
        chunks = total // chunk
        steps = conv_length(chunk)
        frame = torch.arange(total, device=features.device)
        x = features * (frame[None, :] < frames[:, None])[:, None, :]  # a clip's last chunk is zero-padded
        x = self._downsample(x.view(b, mels, chunks, chunk).transpose(1, 2).reshape(b * chunks, 1, mels, chunk))
        h = (x + self.positions[:steps].to(x.dtype)).view(b, chunks * steps, -1)
        lengths = encoded_length(frames, chunk)
        position = torch.arange(chunks * steps, device=h.device)
        window = position // (steps * (self.cfg.n_window_infer // chunk))
        # A key is seen from its own window, if real; a window with no real position (a clip's padding)
        # attends to its first one: no empty softmax.
        first = torch.cat([position.new_ones(1, dtype=torch.bool), window[1:] != window[:-1]])
        key = (position[None, :] < lengths[:, None]) | first[None, :]
        mask = (window[:, None] == window[None, :])[None, None] & key[:, None, None, :]
        for layer in self.layers:
            h = layer(h, mask)
        return self.proj2(self.act(self.proj1(self.ln_post(h)))), lengths

    def _downsample(self, x: torch.Tensor) -> torch.Tensor:
        """Chunks `[N, 1, n_mels, chunk]` -> `[N, positions, d_model]`: the convolutions (channels-last on CUDA,
        the layout cuDNN's tensor-core kernels take), then the projection of each position's channels x bins."""
        if x.is_cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = F.gelu(conv(x))
        n, channels, bins, steps = x.shape
        return self.conv_out(x.permute(0, 3, 1, 2).reshape(n, steps, channels * bins))

    def _encode(self, flat: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """The transformer over windows of each clip's positions (`sizes`, one after another in `flat`)."""
        window = conv_length(self.chunk) * (self.cfg.n_window_infer // self.chunk)
        spans = []  # (start, length) of each window in `flat`
        offset = 0
        for size in sizes:
            spans += [(offset + s, min(window, size - s)) for s in range(0, size, window)]
            offset += size
        longest = max(length for _, length in spans)
        index = torch.tensor([[min(start + i, start + length - 1) for i in range(longest)] for start, length in spans],
                             device=flat.device)
        real = torch.arange(longest, device=flat.device)[None, :] < torch.tensor(
            [length for _, length in spans], device=flat.device)[:, None]
        x = flat[index]  # [windows, longest, dim]; padding repeats a window's last position
        mask = real[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x[real]

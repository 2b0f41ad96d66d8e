"""The codec decoder's causal layers and how they stream.

Every layer is causal, so streaming is exact: each stateful layer (`Stateful`) keeps, per request, the few
past inputs it still needs (conv tails, the previous frames of a transposed conv, the last
`sliding_window - 1` keys/values of each attention layer), passed in and out through a `DecodeStep`.
"""

from __future__ import annotations

import torch
from torch import nn

from streamvox.models.qwen3_tts.codec.config import Code2WavConfig
from streamvox.models.qwen3_tts.model.layers import (
    GatedMlp,
    LayerScaledBlock,
    RMSNorm,
    RotaryAttention,
    activation,
    rope_cos_sin,
    rope_inv_freq,
)


class DecodeStep:
    """What one batched forward needs: carried tails in, new tails out, per-row lengths.

    `frames[b]` is row b's number of real (unpadded) frames in this call; `rows_full`
    says every row is full length (no padding), the common equal-chunk case.
    `tails_in[name]` is a batched tail or None (fresh rows: zeros are implied).
    """

    def __init__(
        self,
        frames: torch.Tensor,
        rows_full: bool,
        start: torch.Tensor,
        tails_in: dict[str, torch.Tensor | None],
        keep_state: bool,
    ) -> None:
        self.frames = frames
        self.rows_full = rows_full
        self.start = start  # absolute frame index of each row's first input frame
        self.tails_in = tails_in
        self.tails_out: dict[str, torch.Tensor] = {}
        self.keep_state = keep_state

    def take_tail(self, x: torch.Tensor, dim: int, valid: torch.Tensor | int, n: int) -> torch.Tensor:
        """The `n` positions of `x` along `dim` just before each row's `valid` end."""
        if self.rows_full or isinstance(valid, int):
            end = x.shape[dim] if isinstance(valid, torch.Tensor) else valid
            return x.narrow(dim, end - n, n).contiguous()
        idx = valid[:, None] - n + torch.arange(n, device=x.device)[None, :]  # [B, n]
        shape = [x.shape[0]] + [1] * (x.dim() - 1)
        shape[dim] = n
        idx = idx.view(shape).expand(*[x.shape[i] if i != dim else n for i in range(x.dim())])
        return torch.gather(x, dim, idx)


class Stateful(nn.Module):
    """A layer that carries a tail between calls; `rate` is its time resolution in steps per frame."""

    tail_name: str = ""
    rate: int = 1

    def _prepend_tail(self, x: torch.Tensor, step: DecodeStep, n: int) -> torch.Tensor:
        """x [B, C, T] behind the last `n` input steps of the previous call (zeros for a fresh
        stream); records this call's last `n` for the next one."""
        tail = step.tails_in.get(self.tail_name)
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], n)
        xc = torch.cat([tail, x], dim=-1)
        if step.keep_state:
            step.tails_out[self.tail_name] = step.take_tail(xc, 2, step.frames * self.rate + n, n)
        return xc


class CausalConv1d(Stateful):
    """Left-padded (causal) stride-1 conv; streaming keeps the last `(k - 1) * dilation` inputs."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        if self.context == 0:
            return self.conv(x)
        return self.conv(self._prepend_tail(x, step, self.context))


class CausalConvTranspose1d(Stateful):
    """Transposed conv trimmed on the right so output `t` only sees inputs `<= t // stride`.

    Streaming prepends the previous `ceil((k - s) / s)` input steps and keeps only
    the outputs that belong to the new ones (zero tails reproduce the offline start).
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride = stride
        self.context = -(-(kernel - stride) // stride)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        t = x.shape[-1]
        if self.context == 0:
            return self.conv(x)[..., : t * self.stride]
        y = self.conv(self._prepend_tail(x, step, self.context))
        off = self.context * self.stride
        return y[..., off : off + t * self.stride]


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    a = alpha.exp()[None, :, None]
    b = beta.exp()[None, :, None]
    return x + torch.sin(x * a).pow(2) / (b + 1e-9)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (log-scale parameters).

    `fn` is `snake`, or its torch.compile'd form on CUDA (`Code2Wav.compile_pointwise`): one fused
    kernel instead of six passes over the activations, which at the late, high-rate blocks are the
    largest tensors of the decoder. Only large inputs (many rows or frames) take the fused form."""

    fn = staticmethod(snake)
    FUSE_MIN_ELEMENTS = 1 << 22  # smaller inputs run eagerly: there the compiled call's host overhead dominates

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < self.FUSE_MIN_ELEMENTS:
            return snake(x, self.alpha, self.beta)
        return self.fn(x, self.alpha, self.beta)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        h = self.dwconv(x, step).transpose(1, 2)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        h = self.conv1(self.act1(x), step)
        return x + self.conv2(self.act2(h), step)


class DecoderBlock(nn.Module):
    """SnakeBeta, upsampling transposed conv (kernel 2r, stride r), three dilated residual units."""

    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalConvTranspose1d(c_in, c_out, 2 * rate, rate)]
            + [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        x = self.block[0](x)
        for layer in self.block[1:]:
            x = layer(x, step)
        return x


class Attention(RotaryAttention, Stateful):
    """Causal self-attention over the last `window` positions (the query's own included)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim, cfg.attention_bias
        )
        self.window = cfg.sliding_window

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, step: DecodeStep
    ) -> torch.Tensor:
        q, k, v = self.rotated_qkv(x, cos, sin)
        ctx = self.window - 1
        if ctx > 0:
            kv = step.tails_in.get(self.tail_name)
            if kv is None:
                kv = k.new_zeros(x.shape[0], 2, self.n_kv, ctx, self.head_dim)
            k = torch.cat([kv[:, 0], k], dim=2)
            v = torch.cat([kv[:, 1], v], dim=2)
            if step.keep_state:
                # tail: the last ctx rotated keys and values, [B, 2, H, ctx, D]
                kv_all = torch.stack([k, v], dim=1)
                step.tails_out[self.tail_name] = step.take_tail(kv_all, 3, step.frames + ctx, ctx)
        return self.attend(q, k, v, mask=mask)


def _transformer_layer(cfg: Code2WavConfig) -> LayerScaledBlock:
    return LayerScaledBlock(
        Attention(cfg),
        GatedMlp(cfg.hidden_size, cfg.intermediate_size, activation(cfg.hidden_act)),
        lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        cfg.hidden_size,
        cfg.layer_scale_initial_scale,
    )


class Transformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_transformer_layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.window = cfg.sliding_window
        self.register_buffer("inv_freq", rope_inv_freq(cfg.attn_head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        """x: [B, T, latent] -> [B, T, latent]."""
        b, t, _ = x.shape
        h = self.input_proj(x)
        rel = torch.arange(t, device=x.device)
        positions = step.start[:, None] + rel[None, :]
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        ctx = self.window - 1
        # keys are [carried ctx | this chunk]; key j sits at offset j - ctx from the chunk start
        k_rel = torch.arange(-ctx, t, device=x.device)
        diff = rel[:, None] - k_rel[None, :]  # query offset - key offset
        allowed = (diff >= 0) & (diff < self.window)
        allowed = allowed[None] & (
            k_rel[None, None, :] >= -step.start[:, None, None]
        )  # no key before frame 0
        mask = allowed[:, None]  # [B, 1, T, ctx + T]
        for layer in self.layers:
            h = layer(h, cos, sin, mask, step)
        return self.output_proj(self.norm(h))

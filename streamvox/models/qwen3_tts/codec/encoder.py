"""Qwen3-TTS-12Hz speech tokenizer encoder: 24 kHz PCM -> 16-codebook codes, in plain torch.

Used for Base-model in-context voice cloning (the reference clip's codes). The
upstream encoder is a Mimi encoder (SEANet conv stack, causal transformer, stride-2
downsample, split RVQ) of which only the first `encoder_valid_num_quantizers`
codebooks are kept. Module names mirror the checkpoint's `encoder.*` keys.

Behaviour follows the reference package (transformers 4.57.3 `MimiModel.encode`):
the encoder transformer attends causally over the whole clip; the config's
`sliding_window` is not applied there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from streamvox.models.qwen3_tts.codec.weights import (
    assign_weights,
    load_speech_tokenizer_state,
    resolve_speech_tokenizer_dir,
)
from streamvox.models.qwen3_tts.model.layers import (
    LayerScaledBlock,
    RotaryAttention,
    activation,
    check_plain_rope,
    rope_cos_sin,
    rope_inv_freq,
)

__all__ = ["CodecEncoder", "CodecEncoderConfig"]


@dataclass
class CodecEncoderConfig:
    """The `encoder_config` (a Mimi config) plus the top-level encode settings."""

    sampling_rate: int = 24000
    frame_rate: float | None = None
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    layer_scale_initial_scale: float = 0.01
    valid_num_quantizers: int = 16
    encode_downsample_rate: int = 1920

    @classmethod
    def from_dict(cls, top: dict[str, Any]) -> CodecEncoderConfig:
        enc = dict(top.get("encoder_config") or {})
        check_plain_rope(enc, "encoder_config")
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in enc.items() if k in known and k != "frame_rate"}
        # transformers stores an explicit frame rate as `_frame_rate` (and it wins when both are present)
        kwargs["frame_rate"] = enc["_frame_rate"] if "_frame_rate" in enc else enc.get("frame_rate")
        if "upsampling_ratios" in kwargs:
            kwargs["upsampling_ratios"] = tuple(int(x) for x in kwargs["upsampling_ratios"])
        if kwargs.get("codebook_dim") is None:
            kwargs["codebook_dim"] = kwargs.get("hidden_size", cls.hidden_size)
        kwargs["valid_num_quantizers"] = int(top.get("encoder_valid_num_quantizers", 16))
        kwargs["encode_downsample_rate"] = int(top.get("encode_downsample_rate", 1920))
        return cls(**kwargs)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def hop(self) -> int:
        return math.prod(self.upsampling_ratios)

    @property
    def encodec_frame_rate(self) -> int:
        return math.ceil(self.sampling_rate / self.hop)

    @property
    def effective_frame_rate(self) -> float:
        if self.frame_rate is not None:
            return float(self.frame_rate)
        return self.sampling_rate / (self.hop * 2)


class MimiConv(nn.Module):
    """Conv1d padded like Mimi's: causal (all padding on the left) plus right padding to whole strides."""

    def __init__(
        self,
        cfg: CodecEncoderConfig,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str | None = None,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.causal = cfg.use_causal_conv
        self.pad_mode = pad_mode or cfg.pad_mode
        if self.pad_mode not in ("constant", "replicate", "reflect"):
            raise ValueError(f"unsupported pad_mode {self.pad_mode!r}")
        self.stride = stride
        self.k_eff = (kernel - 1) * dilation + 1
        self.pad_total = self.k_eff - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        frames = math.ceil((n - self.k_eff + self.pad_total) / self.stride + 1) - 1
        extra = frames * self.stride + self.k_eff - self.pad_total - n
        if self.causal:
            left, right = self.pad_total, extra
        else:
            right = self.pad_total // 2
            left, right = self.pad_total - right, right + extra
        return self.conv(self._pad(x, left, right))

    def _pad(self, x: torch.Tensor, left: int, right: int) -> torch.Tensor:
        if self.pad_mode != "reflect":
            return F.pad(x, (left, right), mode=self.pad_mode)
        # reflect needs more input than padding: zero-extend first, drop it afterwards
        grow = max(0, max(left, right) - x.shape[-1] + 1)
        y = F.pad(F.pad(x, (0, grow)), (left, right), mode="reflect")
        return y[..., : y.shape[-1] - grow]


class ResnetBlock(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilations: tuple[int, int]) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                MimiConv(cfg, dim, hidden, cfg.residual_kernel_size, dilation=dilations[0]),
                nn.ELU(),
                MimiConv(cfg, hidden, dim, 1, dilation=dilations[1]),
            ]
        )
        self.shortcut: nn.Module = MimiConv(cfg, dim, dim, 1) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return self.shortcut(x) + h


class SeanetEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [MimiConv(cfg, cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            ch = scale * cfg.num_filters
            for j in range(cfg.num_residual_layers):
                layers.append(ResnetBlock(cfg, ch, (cfg.dilation_growth_rate**j, 1)))
            layers += [nn.ELU(), MimiConv(cfg, ch, ch * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), MimiConv(cfg, scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class EncAttention(RotaryAttention):
    """Causal self-attention over the whole clip."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim, cfg.attention_bias
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.rotated_qkv(x, cos, sin)
        return self.attend(q, k, v, is_causal=x.shape[1] > 1)


class EncMlp(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _encoder_layer(cfg: CodecEncoderConfig) -> LayerScaledBlock:
    return LayerScaledBlock(
        EncAttention(cfg),
        EncMlp(cfg),
        lambda: nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps),
        cfg.hidden_size,
        cfg.layer_scale_initial_scale,
    )


class EncTransformer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_encoder_layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.register_buffer("inv_freq", rope_inv_freq(cfg.attn_head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)[None].expand(b, t)
        cos, sin = rope_cos_sin(self.inv_freq, pos, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, eps: float = 1e-5) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(cfg.codebook_size))
        self.register_buffer("embed_sum", torch.zeros(cfg.codebook_size, cfg.codebook_dim))
        self.eps = eps

    def table(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=self.eps)[:, None]


class VQLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.codebook = Codebook(cfg)


class EncRVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, n_q: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VQLayer(cfg) for _ in range(n_q)])
        self.input_proj: nn.Module | None = None
        self.output_proj: nn.Module | None = None
        if cfg.vector_quantization_hidden_dimension != cfg.hidden_size:
            vq = cfg.vector_quantization_hidden_dimension
            self.input_proj = nn.Conv1d(cfg.hidden_size, vq, 1, bias=False)
            self.output_proj = nn.Conv1d(vq, cfg.hidden_size, 1, bias=False)

    def encode(self, emb: torch.Tensor, n_q: int) -> torch.Tensor:
        """emb [B, C, T] -> codes [n_q, B, T], nearest codeword by Euclidean distance, residually."""
        if self.input_proj is not None:
            emb = self.input_proj(emb)
        residual = emb.transpose(1, 2)  # [B, T, D]
        b, t, d = residual.shape
        out = []
        for layer in self.layers[:n_q]:
            table = layer.codebook.table()  # type: ignore[union-attr]
            flat = residual.reshape(-1, d)
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(dim=-1).view(b, t)
            residual = residual - F.embedding(idx, table)
            out.append(idx)
        return torch.stack(out)


class EncSplitRVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.n_sem = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = EncRVQ(cfg, self.n_sem)
        self.acoustic_residual_vector_quantizer = EncRVQ(cfg, cfg.num_quantizers - self.n_sem)

    def encode(self, emb: torch.Tensor, n_q: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(emb, self.n_sem)
        if n_q > self.n_sem:
            rest = self.acoustic_residual_vector_quantizer.encode(emb, n_q - self.n_sem)
            codes = torch.cat([codes, rest], dim=0)
        return codes


class MimiEncoderModel(nn.Module):
    """The encoder half of Mimi; attribute names match the `encoder.*` checkpoint keys."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.encoder = SeanetEncoder(cfg)
        self.encoder_transformer = EncTransformer(cfg)
        self.downsample: MimiConv | None = None
        if cfg.effective_frame_rate != cfg.encodec_frame_rate:
            k = 2 * int(cfg.encodec_frame_rate / cfg.effective_frame_rate)
            self.downsample = MimiConv(
                cfg, cfg.hidden_size, cfg.hidden_size, k, stride=2, bias=False, pad_mode="replicate"
            )
        self.quantizer = EncSplitRVQ(cfg)


class CodecEncoder(nn.Module):
    """24 kHz mono PCM -> codes [T, 16] (T = ceil(N / 1920)), matching the reference encoder."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        if not cfg.num_semantic_quantizers <= cfg.valid_num_quantizers <= cfg.num_quantizers:
            raise ValueError("encoder_valid_num_quantizers out of range")
        if cfg.audio_channels != 1:
            raise ValueError("only mono speech tokenizers are supported")
        self.cfg = cfg
        self.mimi = MimiEncoderModel(cfg)

    @property
    def sample_rate(self) -> int:
        return self.cfg.sampling_rate

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> CodecEncoder:
        """Load the `encoder.*` weights of a `speech_tokenizer/` directory."""
        path = resolve_speech_tokenizer_dir(path)
        cfg = CodecEncoderConfig.from_dict(json.loads((path / "config.json").read_text()))
        with torch.device("meta"):
            model = cls(cfg)
        state = load_speech_tokenizer_state(path, "encoder.")
        # the checkpoint may also carry Mimi's decoder half, which encoding never uses
        state = {k: v for k, v in state.items() if k.split(".", 1)[0] in dict(model.mimi.named_children())}
        assign_weights(model.mimi, state, "encoder")
        model.mimi.encoder_transformer.inv_freq = rope_inv_freq(cfg.attn_head_dim, cfg.rope_theta)
        return model.to(device=device, dtype=dtype).eval()

    @torch.inference_mode()
    def encode(self, pcm_24k: torch.Tensor) -> torch.Tensor:
        """pcm_24k: FloatTensor [N] (mono, 24 kHz, roughly [-1, 1]) -> LongTensor [ceil(N / 1920), 16]."""
        if pcm_24k.dim() != 1 or pcm_24k.numel() == 0:
            raise ValueError(f"pcm_24k must be a non-empty 1-D tensor, got shape {tuple(pcm_24k.shape)}")
        p = next(self.parameters())
        x = pcm_24k.to(device=p.device, dtype=p.dtype)[None, None]
        m = self.mimi
        h = m.encoder(x)
        h = m.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        if m.downsample is not None:
            h = m.downsample(h)
        codes = m.quantizer.encode(h, self.cfg.valid_num_quantizers)  # [Q, 1, T']
        n_frames = -(-pcm_24k.numel() // self.cfg.encode_downsample_rate)
        return codes[:, 0, :n_frames].transpose(0, 1).contiguous()

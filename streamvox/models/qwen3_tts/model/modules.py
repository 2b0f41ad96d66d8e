"""Qwen3-TTS talker, code predictor and speaker encoder as plain torch modules.

Module and parameter names follow the upstream checkpoint layout
(`talker.model.layers.0.self_attn.q_proj.weight`, `talker.code_predictor.lm_head.3.weight`,
`speaker_encoder.blocks.0.conv.weight`, ...) so the upstream safetensors load with
`strict=True`. KV caching is explicit: every attention layer calls `cache.update(layer, k, v)`
and attends over what it returns, under a mask the caller builds, so the same layers
serve a one-off dense cache and the engine's preallocated slot cache.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from streamvox.models.qwen3_tts.config import (
    DecoderConfig,
    Qwen3TTSConfig,
    SpeakerEncoderConfig,
    TalkerConfig,
)
from streamvox.models.qwen3_tts.model.layers import GatedMlp, RMSNorm, apply_rope, rope_inv_freq


class KVCache(Protocol):
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values `[B, kv_heads, L, head_dim]` of `layer`; return the keys/values to attend."""
        ...


class DenseCache:
    """Growing per-layer cache for one batch whose rows all have the same length."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.k:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if not self.k else self.k[0].shape[2]


def _act(name: str) -> nn.Module:
    """SiLU, the talker's only activation (runtime/fused_stack.py's fused MLP hard-codes it)."""
    if name != "silu":
        raise ValueError(f"unsupported activation {name!r}")
    return nn.SiLU()


class Rope(nn.Module):
    """Rotary tables. With `mrope_section`, the talker's three position streams (temporal,
    height, width) each own a slice of the frequencies, as upstream; for speech all three
    streams carry the same position, which makes it equal to 1-D RoPE, but the section
    logic is kept so a checkpoint that feeds distinct streams behaves as upstream."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self.section = cfg.mrope_section
        self.interleaved = cfg.mrope_interleaved

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: `[B, L]` (same for all streams) or `[3, B, L]`. Returns cos, sin `[B, L, head_dim]`."""
        if self.section is None:
            freqs = positions.float()[..., None] * self.inv_freq.float()
            emb = torch.cat([freqs, freqs], dim=-1)
            return emb.cos().to(dtype), emb.sin().to(dtype)
        if positions.dim() == 2:
            positions = positions.unsqueeze(0).expand(3, -1, -1)
        freqs = positions.float()[..., None] * self.inv_freq.float()  # [3, B, L, dim/2]
        n = len(self.section)
        if self.interleaved:
            # Frequency j is driven by stream j % n within each stream's span.
            merged = freqs[0].clone()
            for s, count in enumerate(self.section[1:], 1):
                merged[..., s : count * n : n] = freqs[s, ..., s : count * n : n]
            emb = torch.cat([merged, merged], dim=-1)
        else:
            emb_all = torch.cat([freqs, freqs], dim=-1)
            chunks = emb_all.split(list(self.section) * 2, dim=-1)
            emb = torch.cat([c[i % 3] for i, c in enumerate(chunks)], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        b = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=b)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=b)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        bsz, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(bsz, length, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(bsz, length, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(bsz, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k, v = cache.update(self.layer, k, v)
        if mask is None:
            # Causal over the trailing `length` keys (keys before them are all visible).
            total = k.shape[2]
            mask = torch.ones(length, total, dtype=torch.bool, device=x.device).tril(total - length)
        # Grouped-query attention without materialising repeated keys/values.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, length, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = GatedMlp(cfg.hidden_size, cfg.intermediate_size, _act(cfg.hidden_act))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache: KVCache, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Shared forward of the Qwen3 decoder stacks (`layers`, `norm`, `rotary`): the talker, the code predictor and
    the forced aligner's text body."""

    layers: nn.ModuleList
    norm: RMSNorm
    rotary: Rope

    def run(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x `[B, L, H]`, positions `[B, L]`; returns final-normed hidden states `[B, L, H]`."""
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, cache, mask)
        return self.norm(x)


class TalkerModel(DecoderStack):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rope(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class CodePredictorModel(DecoderStack):
    def __init__(self, cfg: DecoderConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rope(cfg)
        self.codec_embedding = nn.ModuleList(
            [nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1)]
        )


class CodePredictor(nn.Module):
    """Fills codebooks 1..G-1 of a frame from the talker's hidden state and codebook 0."""

    def __init__(self, cfg: DecoderConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            [nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)]
        )
        if cfg.hidden_size != talker_hidden:
            self.small_to_mtp_projection: nn.Module = nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()


class TextProjection(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.text_hidden_size, cfg.text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.text_hidden_size, cfg.hidden_size, bias=True)
        self.act_fn = _act(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        assert cfg.code_predictor is not None
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.hidden_size)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Projected text embeddings: the text track's contribution to a talker input."""
        return self.text_projection(self.model.text_embedding(ids))

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of a frame's codebook embeddings. codes `[..., G]` -> `[..., H]`."""
        total = self.model.codec_embedding(codes[..., 0])
        for i, emb in enumerate(self.code_predictor.model.codec_embedding):
            total = total + emb(codes[..., i + 1])
        return total


# --------------------------------------------------------------------------- speaker encoder (ECAPA-TDNN)


class TimeDelayNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            [TimeDelayNetBlock(cin // scale, cout // scale, kernel, dilation) for _ in range(scale - 1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        prev: torch.Tensor | None = None
        for i in range(1, self.scale):
            inp = parts[i] if prev is None else parts[i] + prev
            prev = self.blocks[i - 1](inp)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, cin: int, se: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cin, se, 1, padding="same", padding_mode="reflect")
        self.conv2 = nn.Conv1d(se, cout, 1, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, cout, scale, kernel, dilation)
        self.tdnn2 = TimeDelayNetBlock(cout, cout, 1, 1)
        self.se_block = SqueezeExcitationBlock(cout, se, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatisticsPooling(nn.Module):
    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1, padding="same", padding_mode="reflect")

    @staticmethod
    def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, length), 1.0 / length, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform)
        mean_t = mean.unsqueeze(2).expand(-1, -1, length)
        std_t = std.unsqueeze(2).expand(-1, -1, length)
        ctx = torch.cat([x, mean_t, std_t], 1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = self._stats(x, attn)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """x-vector extractor: mel frames `[B, T, mel_dim]` -> speaker embedding `[B, enc_dim]`."""

    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        if not (len(ch) == len(ks) == len(dil)):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")
        self.blocks = nn.ModuleList([TimeDelayNetBlock(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
            )
        self.mfa = TimeDelayNetBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1, padding="same", padding_mode="reflect")

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        feats = []
        for block in self.blocks:
            x = block(x)
            feats.append(x)
        x = self.mfa(torch.cat(feats[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


class Qwen3TTS(nn.Module):
    """Root module; its state_dict keys equal upstream's (`talker.*`, `speaker_encoder.*`)."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker)
        self.speaker_encoder: SpeakerEncoder | None = (
            SpeakerEncoder(cfg.speaker_encoder) if cfg.tts_model_type == "base" else None
        )

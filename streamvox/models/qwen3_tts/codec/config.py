"""The codec decoder's configuration: the `decoder_config` of a speech tokenizer's `config.json`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from streamvox.models.qwen3_tts.model.layers import check_plain_rope


@dataclass
class Code2WavConfig:
    """The `decoder_config` of a speech tokenizer `config.json` plus the top-level rates."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, top: dict[str, Any]) -> Code2WavConfig:
        """Build from a whole speech tokenizer config (or a bare `decoder_config` dict)."""
        dec = dict(top.get("decoder_config", top))
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: v for k, v in dec.items() if k in known}
        for k in ("upsample_rates", "upsampling_ratios"):
            if k in kwargs:
                kwargs[k] = tuple(int(x) for x in kwargs[k])
        if "output_sample_rate" in top:
            kwargs["output_sample_rate"] = int(top["output_sample_rate"])
        if "decode_upsample_rate" in top:
            kwargs["decode_upsample_rate"] = int(top["decode_upsample_rate"])
        extra = {k: v for k, v in dec.items() if k not in known}
        check_plain_rope(extra, "decoder_config")
        return cls(**kwargs, extra=extra)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def total_upsample(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

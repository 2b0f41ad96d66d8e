"""Parsing of the upstream Qwen3-TTS `config.json` (model_type "qwen3_tts").

Only the fields inference needs are kept; defaults mirror the upstream config
classes so a config that omits a field means the same thing here as there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DecoderConfig:
    """A Qwen3 decoder stack (the talker's or the code predictor's)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    num_code_groups: int = 16
    # Multimodal RoPE sections (talker only); None means plain 1-D RoPE.
    mrope_section: list[int] | None = None
    mrope_interleaved: bool = False


@dataclass
class TalkerConfig(DecoderConfig):
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: dict[str, Any] = field(default_factory=dict)
    spk_is_dialect: dict[str, Any] = field(default_factory=dict)
    codec_language_id: dict[str, int] = field(default_factory=dict)
    code_predictor: DecoderConfig | None = None


@dataclass
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list[int] = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000


@dataclass
class Qwen3TTSConfig:
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig
    tts_model_type: str | None = None  # "custom_voice" | "voice_design" | "base"
    tts_model_size: str | None = None
    tokenizer_type: str | None = None
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def languages(self) -> list[str]:
        """Selectable languages as upstream lists them: "auto" plus every non-dialect id."""
        return ["auto"] + [k for k in self.talker.codec_language_id if "dialect" not in k]

    @property
    def speakers(self) -> list[str]:
        return list(self.talker.spk_id)


def _rope(d: dict[str, Any]) -> tuple[list[int] | None, bool]:
    scaling = d.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(f"unsupported rope_type {rope_type!r} (only 'default' is implemented)")
    section = scaling.get("mrope_section")
    return (list(section) if section else None), bool(scaling.get("interleaved", False))


def _decoder_kwargs(d: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    merged = {**defaults, **{k: v for k, v in d.items() if v is not None}}
    if merged.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported")
    heads = merged["num_attention_heads"]
    head_dim = merged.get("head_dim") or merged["hidden_size"] // heads
    section, interleaved = _rope(merged)
    return dict(
        vocab_size=merged["vocab_size"],
        hidden_size=merged["hidden_size"],
        intermediate_size=merged["intermediate_size"],
        num_hidden_layers=merged["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=merged.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(merged.get("rms_norm_eps", 1e-6)),
        rope_theta=float(merged.get("rope_theta", 10000.0)),
        hidden_act=merged.get("hidden_act", "silu"),
        attention_bias=bool(merged.get("attention_bias", False)),
        max_position_embeddings=int(merged.get("max_position_embeddings", 32768)),
        num_code_groups=int(merged.get("num_code_groups", 32)),
        mrope_section=section,
        mrope_interleaved=interleaved,
    )


# Defaults of the upstream config classes (used when a key is absent).
_PREDICTOR_DEFAULTS: dict[str, Any] = dict(
    vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=32,
)
_TALKER_DEFAULTS: dict[str, Any] = dict(
    vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
    num_attention_heads=16, num_key_value_heads=2, num_code_groups=32,
)


def parse_config(d: dict[str, Any]) -> Qwen3TTSConfig:
    """Build a `Qwen3TTSConfig` from the upstream config.json dictionary."""
    if d.get("model_type", "qwen3_tts") != "qwen3_tts":
        raise ValueError(f"not a qwen3_tts config (model_type={d.get('model_type')!r})")
    t = dict(d.get("talker_config") or {})
    predictor = _decoder_kwargs(dict(t.get("code_predictor_config") or {}), _PREDICTOR_DEFAULTS)
    predictor["mrope_section"] = None  # the code predictor always uses 1-D RoPE
    talker_kwargs = _decoder_kwargs(t, _TALKER_DEFAULTS)
    talker = TalkerConfig(
        **talker_kwargs,
        text_vocab_size=int(t.get("text_vocab_size", 151936)),
        text_hidden_size=int(t.get("text_hidden_size", 2048)),
        codec_eos_token_id=int(t.get("codec_eos_token_id", 4198)),
        codec_think_id=int(t.get("codec_think_id", 4202)),
        codec_nothink_id=int(t.get("codec_nothink_id", 4203)),
        codec_think_bos_id=int(t.get("codec_think_bos_id", 4204)),
        codec_think_eos_id=int(t.get("codec_think_eos_id", 4205)),
        codec_pad_id=int(t.get("codec_pad_id", 4196)),
        codec_bos_id=int(t.get("codec_bos_id", 4197)),
        spk_id=dict(t.get("spk_id") or {}),
        spk_is_dialect=dict(t.get("spk_is_dialect") or {}),
        codec_language_id=dict(t.get("codec_language_id") or {}),
        code_predictor=DecoderConfig(**predictor),
    )
    s = dict(d.get("speaker_encoder_config") or {})
    known = SpeakerEncoderConfig.__dataclass_fields__
    speaker = SpeakerEncoderConfig(**{k: v for k, v in s.items() if k in known})
    top = {k: d[k] for k in (
        "tts_model_type", "tts_model_size", "tokenizer_type", "im_start_token_id", "im_end_token_id",
        "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id") if k in d}
    return Qwen3TTSConfig(talker=talker, speaker_encoder=speaker, raw=d, **top)


def load_config(model_dir: str | Path) -> Qwen3TTSConfig:
    with open(Path(model_dir) / "config.json", encoding="utf-8") as f:
        return parse_config(json.load(f))

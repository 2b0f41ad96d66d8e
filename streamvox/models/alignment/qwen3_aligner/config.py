"""The configuration of a Qwen3-ForcedAligner checkpoint directory (config.json, preprocessor_config.json).

The checkpoint is laid out as a Qwen3-ASR one (`model_type` "qwen3_asr") whose thinker is marked as a
forced aligner (`thinker_config.model_type` "qwen3_forced_aligner", `classify_num` timing classes in
place of the vocabulary head); `timestamp_token_id` and `timestamp_segment_time` (ms per class) sit at
the top level.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamvox.models.qwen3_tts.config import DecoderConfig


class NotAForcedAligner(ValueError):
    """The directory does not hold a Qwen3-ForcedAligner checkpoint."""


@dataclass(frozen=True)
class AudioEncoderConfig:
    """The Qwen3-ASR audio tower: 3 stride-2 convolutions over chunks of mel frames, then a transformer
    encoder that attends within windows of chunks."""

    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    downsample_hidden_size: int = 480
    output_dim: int = 3584
    max_source_positions: int = 1500
    n_window: int = 100  # a chunk is 2 * n_window mel frames
    n_window_infer: int = 400  # attention windows are n_window_infer mel frames' worth of chunks
    activation_function: str = "gelu"


@dataclass(frozen=True)
class FeatureConfig:
    """Whisper-style log-mel features (preprocessor_config.json)."""

    sampling_rate: int = 16000
    feature_size: int = 128
    n_fft: int = 400
    hop_length: int = 160


@dataclass(frozen=True)
class AlignerConfig:
    audio: AudioEncoderConfig
    text: DecoderConfig
    features: FeatureConfig
    classify_num: int
    audio_token_id: int
    timestamp_token_id: int
    timestamp_segment_ms: float


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in cls.__dataclass_fields__}


def _text_config(t: dict[str, Any]) -> DecoderConfig:
    scaling = t.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ValueError(f"unsupported rope_scaling {scaling!r} (only 'default' RoPE is implemented)")
    heads = int(t.get("num_attention_heads", 32))
    # The thinker's multimodal RoPE gets the same position on all three streams for this model (audio
    # and text alike), which makes it plain 1-D RoPE: no sections are kept.
    return DecoderConfig(
        vocab_size=int(t.get("vocab_size", 151936)),
        hidden_size=int(t.get("hidden_size", 4096)),
        intermediate_size=int(t.get("intermediate_size", 22016)),
        num_hidden_layers=int(t.get("num_hidden_layers", 32)),
        num_attention_heads=heads,
        num_key_value_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=int(t.get("head_dim") or int(t.get("hidden_size", 4096)) // heads),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        rope_theta=float(t.get("rope_theta", 5000000.0)),
        hidden_act=t.get("hidden_act", "silu"),
        attention_bias=bool(t.get("attention_bias", False)),
        max_position_embeddings=int(t.get("max_position_embeddings", 128000)),
    )


def load_aligner_config(model_dir: str | os.PathLike[str]) -> AlignerConfig:
    """Read the checkpoint's configuration; raises `NotAForcedAligner` for any other directory."""
    d = Path(model_dir)
    try:
        raw = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise NotAForcedAligner(f"{d} has no readable config.json ({error})") from None
    thinker = raw.get("thinker_config") if isinstance(raw, dict) else None
    if (not isinstance(thinker, dict) or "forced_aligner" not in str(thinker.get("model_type", ""))
            or "timestamp_token_id" not in raw or "classify_num" not in thinker):
        raise NotAForcedAligner(f"{d} is not a Qwen3-ForcedAligner checkpoint (its config.json has no forced-aligner "
                                "thinker with timing classes)")
    features_path = d / "preprocessor_config.json"
    features = json.loads(features_path.read_text(encoding="utf-8")) if features_path.exists() else {}
    return AlignerConfig(
        audio=AudioEncoderConfig(**_known(AudioEncoderConfig, thinker.get("audio_config") or {})),
        text=_text_config(thinker.get("text_config") or {}),
        features=FeatureConfig(**_known(FeatureConfig, features)),
        classify_num=int(thinker["classify_num"]),
        audio_token_id=int(thinker.get("audio_token_id", 151646)),
        timestamp_token_id=int(raw["timestamp_token_id"]),
        timestamp_segment_ms=float(raw.get("timestamp_segment_time", 80.0)),
    )

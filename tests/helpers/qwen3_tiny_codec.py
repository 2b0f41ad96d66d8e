"""A tiny random-weight Qwen3-TTS-12Hz speech tokenizer checkpoint (`speech_tokenizer/`).

Same architecture, config keys and tensor names as the upstream one, with small
widths, so both StreamVox and the reference `qwen-tts` package load it. The
decoder keeps the real upsampling (1920 samples per frame at 24 kHz) and the
encoder the real strides, so frame timing is the real one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

TINY_DECODER_CONFIG: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "codebook_dim": 32,
    "codebook_size": 64,
    "decoder_dim": 32,
    "head_dim": 12,
    "hidden_act": "silu",
    "hidden_size": 32,
    "intermediate_size": 64,
    "latent_dim": 48,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_quantizers": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "sliding_window": 8,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
}

TINY_ENCODER_CONFIG: dict[str, Any] = {
    "_frame_rate": 12.5,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "audio_channels": 1,
    "codebook_dim": 16,
    "codebook_size": 64,
    "compress": 2,
    "dilation_growth_rate": 2,
    "head_dim": 8,
    "hidden_act": "gelu",
    "hidden_size": 32,
    "intermediate_size": 64,
    "kernel_size": 7,
    "last_kernel_size": 3,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "model_type": "mimi",
    "norm_eps": 1e-5,
    "num_attention_heads": 4,
    "num_filters": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "num_quantizers": 20,
    "num_residual_layers": 1,
    "num_semantic_quantizers": 1,
    "pad_mode": "constant",
    "residual_kernel_size": 3,
    "rope_theta": 10000.0,
    "sampling_rate": 24000,
    "sliding_window": 6,
    "trim_right_ratio": 1.0,
    "upsample_groups": 32,
    "upsampling_ratios": [8, 6, 5, 4],
    "use_cache": False,
    "use_causal_conv": True,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 16,
}

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


_LAST_DECODER_CONV = f"decoder.decoder.{len(TINY_DECODER_CONFIG['upsample_rates']) + 2}.conv.weight"


def tiny_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "dtype": "float32",
        "encoder_config": dict(TINY_ENCODER_CONFIG),
        "decoder_config": dict(TINY_DECODER_CONFIG),
    }


def _random_tensor(
    name: str, shape: tuple[int, ...], g: torch.Generator, transposed: bool = False
) -> torch.Tensor:
    """Random values with magnitudes that keep activations O(1) and audio mostly inside [-1, 1]."""

    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=g) * std

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "initialized":
        return torch.ones(shape)
    if leaf == "cluster_usage":
        return uniform(0.5, 2.0)
    if leaf == "embedding_sum":  # decoder codebooks
        return normal(1.0)
    if leaf == "embed_sum":  # encoder codebooks: spaced finely enough that many codes get used
        return normal(0.3)
    if leaf == "alpha":
        return normal(0.1)
    if leaf == "beta":  # sin^2 term divided by e^beta ~ 2: keeps SnakeBeta gentle
        return 0.7 + normal(0.1)
    if leaf == "scale":  # layer scale: large enough that the transformers matter
        return uniform(0.2, 0.8)
    if leaf == "gamma":
        return uniform(0.2, 0.8)
    if leaf == "bias":
        if "norm" in name:
            return normal(0.1)
        return normal(0.05)
    if leaf == "weight" and len(shape) == 1:  # norms
        return 1.0 + normal(0.1)
    if leaf == "weight":
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        if transposed:  # weight is [in, out, k]; each output sees about in * k / stride inputs
            fan_in = shape[0] * shape[2] // 2
        std = 1.0 / math.sqrt(max(fan_in, 1))
        if name.endswith("conv2.conv.weight"):  # residual branches: small, so depth does not blow up
            std *= 0.3
        if name == _LAST_DECODER_CONV:  # keep the waveform mostly inside the [-1, 1] clamp
            std *= 0.4
        return normal(std)
    raise ValueError(f"no init rule for {name}")


def _decoder_shapes(cfg: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], bool]]:
    from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
    from streamvox.models.qwen3_tts.codec.config import Code2WavConfig

    with torch.device("meta"):
        model = Code2Wav(Code2WavConfig.from_dict(cfg))
    transposed = {n for n, m in model.decoder.named_modules() if isinstance(m, torch.nn.ConvTranspose1d)}
    out = {}
    for k, v in model.decoder.state_dict().items():
        out["decoder." + k] = (tuple(v.shape), k.rsplit(".", 1)[0] in transposed)
    return out


def _encoder_shapes(cfg: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], bool]]:
    from streamvox.models.qwen3_tts.codec.encoder import CodecEncoder, CodecEncoderConfig

    with torch.device("meta"):
        model = CodecEncoder(CodecEncoderConfig.from_dict(cfg))
    return {"encoder." + k: (tuple(v.shape), False) for k, v in model.mimi.state_dict().items()}


def build_tiny_speech_tokenizer(path: str | Path, seed: int = 0, with_encoder: bool = True) -> Path:
    """Write config.json, preprocessor_config.json and model.safetensors into `path`; return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config()
    shapes = _decoder_shapes(cfg)
    if with_encoder:
        shapes.update(_encoder_shapes(cfg))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        shape, transposed = shapes[name]
        tensors[name] = _random_tensor(name, shape, g, transposed).contiguous()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    return path

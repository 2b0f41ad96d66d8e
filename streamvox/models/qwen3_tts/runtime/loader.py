"""Building a `Qwen3TTSRunner` from a checkpoint: the model, the speech tokenizer's streaming decoder (its
dtype checked against float32 on the checkpoint's own weights) and its encoder for in-context cloning."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav, agreement_db
from streamvox.models.qwen3_tts.codec.encoder import CodecEncoder
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.decode_pipeline import StreamingCodec
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.models.qwen3_tts.runtime.voices import ReferenceEncoder
from streamvox.models.qwen3_tts.speaker import resample
from streamvox.settings import Qwen3Settings

log = logging.getLogger(__name__)

# The codec decoder's dtype ("auto": see load_codec) and, for "auto" on CUDA, how closely float16 must decode
# as float32 on the served checkpoint. On the H200 (random 1.7B-shape weights, gpu_bench.py --micro): TF32
# convolutions 60 dB against strict float32, float16 54 dB, bfloat16 36 dB; float16 served 64 streams
# 11% faster than float32.
FLOAT16_MIN_DB = 45.0


def load_runner(model_path: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype = torch.float32,
                settings: Qwen3Settings | None = None, **kwargs: Any) -> Qwen3TTSRunner:
    """Build a runner from a checkpoint directory or HF repo id, with the speech tokenizer's
    streaming decoder (and reference encoder, for in-context cloning) when they are available.
    `settings`: the runtime knobs (default: their defaults); `kwargs` go to `Qwen3TTSRunner`."""
    settings = settings or Qwen3Settings()
    model = Qwen3TTSModel.from_pretrained(model_path, device=device, dtype=dtype)
    assert model.model_dir is not None
    st_dir = model.model_dir / "speech_tokenizer"
    codec = kwargs.pop("codec", None) or load_codec(st_dir, device, settings.codec_dtype, settings.codec_compile)
    ref_enc = kwargs.pop("reference_encoder", None) or load_reference_encoder(st_dir, device)
    # A repo id names the model better than its snapshot directory (a commit hash).
    given = Path(model_path)
    name = kwargs.pop("name", None) or (given.name if given.is_dir() else str(model_path))
    return Qwen3TTSRunner(model, codec, reference_encoder=ref_enc, name=name, settings=settings, **kwargs)


def load_codec(st_dir: Path, device: str, dtype: str, compile_snake: bool = True) -> StreamingCodec | None:
    """The speech tokenizer's decoder in `dtype` (a torch dtype's name, or "auto": float32, and on CUDA
    float16 instead when it decodes as float32 does to FLOAT16_MIN_DB on this checkpoint's weights);
    None without a speech tokenizer. `compile_snake`: see `Code2Wav.from_pretrained`."""
    if not (st_dir / "config.json").exists():
        return None
    if dtype != "auto":
        return Code2Wav.from_pretrained(st_dir, device=device, dtype=getattr(torch, dtype),
                                        compile_snake=compile_snake)
    codec = Code2Wav.from_pretrained(st_dir, device=device, dtype=torch.float32, compile_snake=compile_snake)
    if torch.device(device).type != "cuda":
        return codec
    half = Code2Wav.from_pretrained(st_dir, device=device, dtype=torch.float16, compile_snake=compile_snake)
    db = agreement_db(codec, half)
    if db < FLOAT16_MIN_DB:
        log.warning("codec decoder: float16 decodes %.1f dB from float32 (< %.0f dB): float32", db, FLOAT16_MIN_DB)
        return codec
    log.info("codec decoder: float16 (%.1f dB from float32)", db)
    return half


def load_reference_encoder(st_dir: Path, device: str) -> ReferenceEncoder | None:
    """Reference codes for in-context cloning from the speech tokenizer's encoder (`CodecEncoder.encode` of the
    audio at its rate), or None without a speech tokenizer."""
    if not (st_dir / "config.json").exists():
        return None
    enc = CodecEncoder.from_pretrained(st_dir, device=device)
    rate = int(enc.sample_rate)

    def encode(pcm: np.ndarray, sr: int) -> torch.Tensor:
        with torch.inference_mode():
            return enc.encode(torch.from_numpy(resample(pcm, sr, rate))).cpu()

    return encode

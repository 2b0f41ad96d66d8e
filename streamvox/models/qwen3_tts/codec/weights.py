"""Reading a speech tokenizer checkpoint (`speech_tokenizer/`: config.json and safetensors), shared by the
decoder (`code2wav.py`) and the encoder (`encoder.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn


def resolve_speech_tokenizer_dir(path: str | Path) -> Path:
    """Accept either the `speech_tokenizer/` dir itself or a full Qwen3-TTS model dir holding one."""
    path = Path(path)
    if not (path / "config.json").exists() and (path / "speech_tokenizer" / "config.json").exists():
        return path / "speech_tokenizer"
    if (path / "speech_tokenizer" / "config.json").exists():
        top = json.loads((path / "config.json").read_text())
        if "decoder_config" not in top:
            return path / "speech_tokenizer"
    return path


def load_speech_tokenizer_state(path: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors under `prefix` from a speech tokenizer dir's safetensors files, prefix stripped."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if k.startswith(prefix):
                out[k[len(prefix) :]] = v
    return out


def assign_weights(module: nn.Module, state: dict[str, torch.Tensor], half: str) -> None:
    """Give a `module` built on the meta device the tensors of `state`; a missing or unexpected key is an error."""
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"speech tokenizer {half} weights mismatch: missing={missing} unexpected={unexpected}")

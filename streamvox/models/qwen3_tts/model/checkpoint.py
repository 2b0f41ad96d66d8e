"""Loading a Qwen3-TTS checkpoint.

`Qwen3TTSModel.from_pretrained(path_or_repo)` reads config.json, the safetensors
weights (single file or sharded), generation_config.json and the tokenizer files,
and offers the embeddings the prompt and the frame steps are made of.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from streamvox.models.qwen3_tts.config import Qwen3TTSConfig, load_config
from streamvox.models.qwen3_tts.model.modules import Qwen3TTS, Rope
from streamvox.models.qwen3_tts.speaker import log_mel, resample
from streamvox.models.qwen3_tts.text import TextTokenizer, load_tokenizer

TASKS = ("custom_voice", "voice_design", "base")

# Used when generation_config.json lacks a key (upstream's hard defaults).
GENERATION_DEFAULTS: dict[str, Any] = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
    max_new_tokens=2048,
)


def resolve_model_dir(path_or_repo: str | os.PathLike[str]) -> Path:
    """A local directory as is; otherwise a Hugging Face repo id fetched with snapshot_download
    (which honours HF_HUB_OFFLINE and the local cache)."""
    p = Path(path_or_repo)
    if p.is_dir():
        return p
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path_or_repo)))


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(model_dir / name)))
    return state


class Qwen3TTSModel:
    """A loaded checkpoint: the torch module, its config, tokenizer and generation defaults."""

    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        module: Qwen3TTS,
        tokenizer: TextTokenizer,
        generation: dict[str, Any] | None = None,
        model_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.module = module.eval().requires_grad_(False)  # inference only (torch.compile traces no backward)
        self.talker = module.talker
        self.tokenizer = tokenizer
        self.generation = {**GENERATION_DEFAULTS, **(generation or {})}
        self.model_dir = model_dir
        p = next(module.parameters())
        self.device, self.dtype = p.device, p.dtype
        with torch.inference_mode():
            special = torch.tensor([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])
            embeds = self.talker.text_embed(special.to(self.device))
            self.tts_bos, self.tts_eos, self.tts_pad = embeds.unbind(0)
            pad = torch.tensor(cfg.talker.codec_pad_id, device=self.device)
            self.codec_pad = self.talker.model.codec_embedding(pad)  # the non-streaming text track's codec side

    @classmethod
    def from_pretrained(
        cls, path_or_repo: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> Qwen3TTSModel:
        model_dir = resolve_model_dir(path_or_repo)
        cfg = load_config(model_dir)
        if cfg.tts_model_type not in TASKS:
            raise ValueError(f"unsupported tts_model_type {cfg.tts_model_type!r}; expected one of {TASKS}")
        with torch.device("meta"):
            module = Qwen3TTS(cfg)
        state = load_state_dict(model_dir)
        module.load_state_dict(state, strict=True, assign=True)
        # Non-persistent buffers (RoPE tables) were created on meta: rebuild them for real.
        assert cfg.talker.code_predictor is not None
        module.talker.model.rotary = Rope(cfg.talker)
        module.talker.code_predictor.model.rotary = Rope(cfg.talker.code_predictor)
        module = module.to(device=device, dtype=dtype)
        # Keep the RoPE frequency tables in float32 (a low-precision dtype would round them).
        module.talker.model.rotary = Rope(cfg.talker).to(device)
        module.talker.code_predictor.model.rotary = Rope(cfg.talker.code_predictor).to(device)
        gen_path = model_dir / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        return cls(cfg, module, TextTokenizer(load_tokenizer(model_dir)), generation, model_dir)

    # ------------------------------------------------------------------ voice inputs

    @torch.inference_mode()
    def speaker_embedding(self, pcm: np.ndarray, sr: int) -> torch.Tensor:
        """x-vector of reference audio (mono float32 at `sr`), as upstream: resample to the
        encoder's rate, 128-bin log-mel, ECAPA-TDNN."""
        enc = self.module.speaker_encoder
        if enc is None:
            raise ValueError("this checkpoint has no speaker encoder")
        target = self.cfg.speaker_encoder.sample_rate
        wav = torch.from_numpy(resample(pcm, sr, target)).unsqueeze(0)
        mels = log_mel(wav, sr=target, n_mels=self.cfg.speaker_encoder.mel_dim)
        return enc(mels.to(self.device, self.dtype))[0]

    # ------------------------------------------------------------------ embeddings

    def ids_on_device(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Ids as a device tensor without waiting for the GPU: on CUDA an asynchronous copy from pinned
        memory (a plain copy from pageable memory would wait for all the work queued on the stream, so
        admitting a request would stall the engine until the running frame steps finish)."""
        t = torch.as_tensor(ids, dtype=torch.long)
        if t.device == self.device:
            return t
        if self.device.type == "cuda" and t.device.type == "cpu":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def codec_embed(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(self.ids_on_device(ids))

    def text_embed(self, ids: list[int]) -> torch.Tensor:
        return self.talker.text_embed(self.ids_on_device(ids).reshape(-1))

    def track_embed(self, track: list[int], index: int, done: bool) -> torch.Tensor:
        """Embedding of item `index` of `track + [tts_eos] + [tts_pad]*` (caller checks availability)."""
        if index < len(track):
            return self.text_embed([track[index]])[0]
        if not done:
            raise ValueError("text track item not available yet")
        return self.tts_eos if index == len(track) else self.tts_pad

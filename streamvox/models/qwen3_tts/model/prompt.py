"""Loading a Qwen3-TTS checkpoint and building the talker's prompt.

`Qwen3TTSModel.from_pretrained(path_or_repo)` reads config.json, the safetensors
weights (single file or sharded), generation_config.json and the tokenizer files.
`build_prompt(...)` turns one request (text track, voice, language, instructions,
reference) into the prefill embeddings plus a description of the text track that
continues after the prompt, one text token per generated frame.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
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


@dataclass
class Prompt:
    """Prefill embeddings `[L, H]` and where the text track continues.

    `track` is the list of text ids that feed the dual track (reference transcript +
    text in in-context mode, else the text). After the prompt, decode step g adds
    the embedding of item `track_offset + g` of `track + [tts_eos] + [tts_pad]...`;
    `track_offset=None` means the track is used up (pad only: non-streaming mode).
    """

    embeds: torch.Tensor
    track_offset: int | None


@dataclass
class VoiceSpec:
    """Everything about one request's voice and style, already validated."""

    task: str
    language_id: int | None
    speaker_id: Any = None  # CustomVoice codec id (int or list of ints)
    instruct_ids: list[int] | None = None
    speaker_embedding: torch.Tensor | None = None  # Base: x-vector `[H]`
    ref_codes: torch.Tensor | None = None  # Base in-context: `[T, G]`
    ref_text_ids: list[int] = field(default_factory=list)
    non_streaming: bool = False


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
        self._leads: dict[tuple[int | None, Any], tuple[torch.Tensor, torch.Tensor]] = {}  # see _prompt_lead

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

    # ------------------------------------------------------------------ prompt

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

    @torch.inference_mode()
    def build_prompt(self, spec: VoiceSpec, track: list[int], done: bool) -> Prompt:
        """Prefill embeddings for one request. `track`: text ids known so far; `done`: no more will come.

        The caller must only call this when `prompt_ready(spec, track, done)` holds.
        """
        c = self.cfg.talker
        parts: list[torch.Tensor] = []
        if spec.instruct_ids:
            parts.append(self.text_embed(spec.instruct_ids))
        lead, codec_last = self._prompt_lead(spec)
        parts.append(lead)
        offset: int | None
        if spec.ref_codes is not None:
            # In-context cloning: transcript+text track against [codec_bos] + reference frames.
            ref_frames = self.talker.frame_embed(self.ids_on_device(spec.ref_codes))
            codec_track = torch.cat([self.codec_embed([c.codec_bos_id]), ref_frames], 0)
            m = codec_track.shape[0]
            if spec.non_streaming:
                full = torch.cat([self.text_embed(track), self.tts_eos.unsqueeze(0)], 0)
                full = full + self.codec_pad
                parts += [full, codec_track + self.tts_pad]
                offset = None
            else:
                items = [self.track_embed(track, i, done) for i in range(m)]
                parts.append(torch.stack(items, 0) + codec_track)
                offset = m
        elif spec.non_streaming:
            full = torch.cat([self.text_embed(track), self.tts_eos.unsqueeze(0)], 0)
            full = full + self.codec_pad
            parts += [full, (self.tts_pad + codec_last).unsqueeze(0)]
            offset = None
        else:
            parts.append((self.text_embed(track[:1])[0] + codec_last).unsqueeze(0))
            offset = 1
        return Prompt(torch.cat(parts, 0), offset)

    def _prompt_lead(self, spec: VoiceSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's rows between the instructions and the text track (the role, then the codec prefix with
        its text-side pads) and the codec prefix's last row, which the text track's first row adds.

        They depend only on the language and the speaker, so for a speaker id they are built once per pair and
        kept (the pairs come from the config, so the store stays small): building them is ~25 small device ops,
        most of a prompt's host time, which a burst of arrivals otherwise pays request by request before its
        prefill can start. An x-vector voice is built each time."""
        key = None if spec.speaker_embedding is not None else (
            spec.language_id, tuple(spec.speaker_id) if isinstance(spec.speaker_id, list) else spec.speaker_id)
        if key in self._leads:
            return self._leads[key]
        c = self.cfg.talker
        if spec.language_id is None:
            codec_ids = [c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
        else:
            codec_ids = [c.codec_think_id, c.codec_think_bos_id, spec.language_id, c.codec_think_eos_id]
        codec = [self.codec_embed(codec_ids)]
        if spec.speaker_id is not None:
            codec.append(self.codec_embed(spec.speaker_id).reshape(1, -1))
        elif spec.speaker_embedding is not None:
            codec.append(spec.speaker_embedding.reshape(1, -1).to(self.dtype))
        codec.append(self.codec_embed([c.codec_pad_id, c.codec_bos_id]))
        codec_all = torch.cat(codec, 0)
        n = codec_all.shape[0]
        text_side = torch.cat([self.tts_pad.expand(n - 2, -1), self.tts_bos.unsqueeze(0)], 0)
        lead = torch.cat([self.text_embed(self.tokenizer.role_ids()), text_side + codec_all[:-1]], 0), codec_all[-1]
        if key is not None:
            self._leads[key] = lead
        return lead

    def prompt_ready(self, spec: VoiceSpec, track: list[int], done: bool) -> bool:
        """Whether the prompt can be built from the text known so far."""
        if done:
            return True
        if spec.non_streaming:
            return False
        if spec.ref_codes is not None:
            return len(track) >= spec.ref_codes.shape[0] + 1
        return len(track) >= 1

"""Voice cloning (Base checkpoints): what a voice is made of, derived from reference audio, and the voices
registered by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from streamvox.contract import RequestError, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.model.prompt import VoiceSpec

ReferenceEncoder = Callable[[np.ndarray, int], torch.Tensor]  # (pcm, sr) -> LongTensor [T, G]


@dataclass
class ClonedVoice:
    """What voice cloning derives from reference audio, computed once per registered voice."""

    speaker_embedding: torch.Tensor
    ref_codes: torch.Tensor | None = None  # in-context cloning: `[T, G]`
    ref_text_ids: list[int] = field(default_factory=list)


class VoiceCloning:
    """Speaker embeddings (x-vector cloning) and, with a transcript, reference codes (in-context cloning)
    from mono float32 PCM; `voices` holds the ones registered by name."""

    def __init__(self, model: Qwen3TTSModel, reference_encoder: ReferenceEncoder | None,
                 max_ref_audio_seconds: float) -> None:
        self.model = model
        self.reference_encoder = reference_encoder
        self.max_ref_audio_seconds = max_ref_audio_seconds
        self.groups = model.cfg.talker.num_code_groups
        self.voices: dict[str, ClonedVoice] = {}

    def apply(self, r: SpeechRequest, spec: VoiceSpec) -> None:
        """Fill `spec` with the request's cloned voice: its `speaker_embedding`, its `ref_audio`, or the registered
        voice it names."""
        if r.speaker_embedding is not None:
            voice = ClonedVoice(self.embedding(r.speaker_embedding))
        elif r.ref_audio:
            voice = self.analyse(r.ref_audio, r.ref_sample_rate, r.ref_text)
        elif r.voice:
            voice = self.voices.get(r.voice)
            if voice is None:
                known = ", ".join(sorted(self.voices)) or "none yet; POST /v1/audio/voices adds one"
                raise RequestError(f"unknown voice {r.voice!r}; cloned voices: {known}", param="voice")
        else:
            raise RequestError("voice cloning needs ref_audio (mono float32 PCM) or the name of a cloned voice",
                               param="ref_audio")
        spec.speaker_embedding = voice.speaker_embedding
        if voice.ref_codes is not None:
            spec.ref_codes = voice.ref_codes
            spec.ref_text_ids = list(voice.ref_text_ids)
        spec.non_streaming = False  # upstream's voice clone default

    def embedding(self, data: bytes) -> torch.Tensor:
        """A request's own x-vector (little-endian float32) as the speaker encoder would give it."""
        size = self.model.cfg.speaker_encoder.enc_dim
        if len(data) != 4 * size:
            raise RequestError(f"speaker_embedding must hold {size} float32 values (this model's x-vector size)",
                               param="speaker_embedding")
        vector = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.isfinite(vector).all():
            raise RequestError("speaker_embedding holds values that are not finite numbers", param="speaker_embedding")
        return torch.from_numpy(vector).to(self.model.device)

    def analyse(self, ref_audio: bytes, sr: int | None, ref_text: str | None) -> ClonedVoice:
        """Speaker embedding (and, with `ref_text`, reference codes) of reference audio."""
        if not sr or sr <= 0:
            raise RequestError("ref_sample_rate must be a positive integer", param="ref_sample_rate")
        if len(ref_audio) % 4:
            raise RequestError("ref_audio is not float32 PCM (length not a multiple of 4 bytes)",
                               param="ref_audio")
        pcm = np.frombuffer(ref_audio, dtype="<f4").astype(np.float32)
        if pcm.size < sr // 10 or not np.isfinite(pcm).all():
            raise RequestError("ref_audio could not be decoded (shorter than 0.1 s or not finite)",
                               param="ref_audio")
        if pcm.size > self.max_ref_audio_seconds * sr:
            raise RequestError(f"ref_audio is longer than {self.max_ref_audio_seconds:g} s",
                               param="ref_audio")
        try:
            voice = ClonedVoice(self.model.speaker_embedding(pcm, sr))
        except (RuntimeError, ValueError) as e:
            raise RequestError(f"ref_audio could not be analysed: {e}", param="ref_audio") from e
        if ref_text:
            if self.reference_encoder is None:
                raise RequestError("in-context cloning (ref_text) needs the speech tokenizer encoder, "
                                   "which this deployment lacks; omit ref_text for x-vector cloning",
                                   param="ref_text")
            try:
                codes = self.reference_encoder(pcm, sr)
            except (RuntimeError, ValueError) as e:
                raise RequestError(f"ref_audio could not be encoded: {e}", param="ref_audio") from e
            if codes.dim() != 2 or codes.shape[1] != self.groups or codes.shape[0] == 0:
                raise RequestError("ref_audio could not be encoded into reference codes", param="ref_audio")
            voice.ref_codes = codes.long()
            voice.ref_text_ids = self.model.tokenizer.ref_text_ids(ref_text)
        return voice

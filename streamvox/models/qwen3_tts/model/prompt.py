"""The talker's prompt for one request.

`PromptBuilder.build(spec, track, done)` turns one request (voice, language, instructions,
reference, and the text track known so far) into the prefill embeddings plus a description
of the text track that continues after the prompt, one text token per generated frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel


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


def prompt_ready(spec: VoiceSpec, track: list[int], done: bool) -> bool:
    """Whether the prompt can be built from the text known so far."""
    if done:
        return True
    if spec.non_streaming:
        return False
    if spec.ref_codes is not None:
        return len(track) >= spec.ref_codes.shape[0] + 1
    return len(track) >= 1


class PromptBuilder:
    """Builds prompts from a loaded checkpoint, keeping the parts shared by many requests (`_lead`)."""

    def __init__(self, model: Qwen3TTSModel) -> None:
        self.model = model
        self._leads: dict[tuple[int | None, Any], tuple[torch.Tensor, torch.Tensor]] = {}  # see _lead

    @torch.inference_mode()
    def build(self, spec: VoiceSpec, track: list[int], done: bool) -> Prompt:
        """Prefill embeddings for one request. `track`: text ids known so far; `done`: no more will come.

        The caller must only call this when `prompt_ready(spec, track, done)` holds.
        """
        model = self.model
        c = model.cfg.talker
        parts: list[torch.Tensor] = []
        if spec.instruct_ids:
            parts.append(model.text_embed(spec.instruct_ids))
        lead, codec_last = self._lead(spec)
        parts.append(lead)
        offset: int | None
        if spec.ref_codes is not None:
            # In-context cloning: transcript+text track against [codec_bos] + reference frames.
            ref_frames = model.talker.frame_embed(model.ids_on_device(spec.ref_codes))
            codec_track = torch.cat([model.codec_embed([c.codec_bos_id]), ref_frames], 0)
            m = codec_track.shape[0]
            if spec.non_streaming:
                full = torch.cat([model.text_embed(track), model.tts_eos.unsqueeze(0)], 0)
                full = full + model.codec_pad
                parts += [full, codec_track + model.tts_pad]
                offset = None
            else:
                items = [model.track_embed(track, i, done) for i in range(m)]
                parts.append(torch.stack(items, 0) + codec_track)
                offset = m
        elif spec.non_streaming:
            full = torch.cat([model.text_embed(track), model.tts_eos.unsqueeze(0)], 0)
            full = full + model.codec_pad
            parts += [full, (model.tts_pad + codec_last).unsqueeze(0)]
            offset = None
        else:
            parts.append((model.text_embed(track[:1])[0] + codec_last).unsqueeze(0))
            offset = 1
        return Prompt(torch.cat(parts, 0), offset)

    def _lead(self, spec: VoiceSpec) -> tuple[torch.Tensor, torch.Tensor]:
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
        model = self.model
        c = model.cfg.talker
        if spec.language_id is None:
            codec_ids = [c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
        else:
            codec_ids = [c.codec_think_id, c.codec_think_bos_id, spec.language_id, c.codec_think_eos_id]
        codec = [model.codec_embed(codec_ids)]
        if spec.speaker_id is not None:
            codec.append(model.codec_embed(spec.speaker_id).reshape(1, -1))
        elif spec.speaker_embedding is not None:
            codec.append(spec.speaker_embedding.reshape(1, -1).to(model.dtype))
        codec.append(model.codec_embed([c.codec_pad_id, c.codec_bos_id]))
        codec_all = torch.cat(codec, 0)
        n = codec_all.shape[0]
        text_side = torch.cat([model.tts_pad.expand(n - 2, -1), model.tts_bos.unsqueeze(0)], 0)
        lead = torch.cat([model.text_embed(model.tokenizer.role_ids()), text_side + codec_all[:-1]], 0), codec_all[-1]
        if key is not None:
            self._leads[key] = lead
        return lead

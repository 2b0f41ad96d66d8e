"""One request's state in the Qwen3-TTS runner, and admission: a `SpeechRequest` validated into it.

Everything a request owns (slot, text, sampler generator, frame buffer, codec state) lives in its
`Request` and is dropped on finish, failure or release.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from streamvox.contract import RequestError, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.model.prompt import VoiceSpec
from streamvox.models.qwen3_tts.openai_voices import speaker_for
from streamvox.models.qwen3_tts.runtime.voices import VoiceCloning
from streamvox.models.qwen3_tts.sampling import MIN_TEMPERATURE, SamplerSettings
from streamvox.models.qwen3_tts.text import IncrementalText

TASK_ALIASES = {
    "custom_voice": "custom_voice", "customvoice": "custom_voice", "custom": "custom_voice",
    "voice_design": "voice_design", "voicedesign": "voice_design", "design": "voice_design",
    "base": "base", "voice_clone": "base", "clone": "base",
}

FrameHook = Callable[[str, torch.Tensor], None]  # (request id, frame `[G]`): sees every generated frame


@dataclass
class Request:
    """One admitted request: its voice, sampling, text track, KV slot and positions, pending codebook-0 id,
    buffered frames and codec state."""

    rid: str
    spec: VoiceSpec
    talker_sampling: SamplerSettings
    predictor_sampling: SamplerSettings
    generator: torch.Generator | None
    max_frames: int
    text: IncrementalText
    initial_chunk: int | None
    track: list[int] = field(default_factory=list)
    text_done: bool = False
    slot: int | None = None
    length: int = 0  # positions in the talker cache
    offset: int | None = None  # text-track index used by the next talker step (None: pad only)
    hidden: torch.Tensor | None = None  # talker's last hidden state
    token: int | None = None  # pending codebook-0 id (its frame is not complete yet)
    history: list[int] = field(default_factory=list)
    n_frames: int = 0
    buffer: list[torch.Tensor] = field(default_factory=list)
    chunks: int = 0
    first_chunk: int = 1  # frames in the first chunk (later chunks double from it)
    codec_state: Any = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    fast: bool = False  # state lives in the FrameStepper's slot buffers
    seed: int = 0  # the sampling seed (the request's or a random one; the fast path's noise)
    inflight: int = 0  # decoder calls whose audio has not been sent yet
    text_tokens: int = 0  # ids of the text to speak (usage: input_tokens)
    has_words: bool = False  # any non-whitespace text seen
    created: float = field(default_factory=time.perf_counter)
    audio_sent: bool = False

    @property
    def sampled(self) -> bool:
        """Whether the talker or the code predictor samples (not greedy)."""
        return not (self.talker_sampling.greedy and self.predictor_sampling.greedy)

    @property
    def generating(self) -> bool:
        """Holds a pending codebook-0 id: its next frame step can run."""
        return self.token is not None and self.finish_reason is None

    def can_step(self) -> bool:
        """Whether the next frame step has the text-track item it needs (a request waiting for its next
        text token is not scheduled)."""
        if self.n_frames + 1 >= self.max_frames or self.offset is None:
            return True  # no text needed (last frame, or pad-only track)
        return self.text_done or self.offset < len(self.track)

    def feed(self, text: str) -> None:
        """More input text (ignored once the text is complete)."""
        if self.text_done:
            return
        self.has_words = self.has_words or bool(text.strip())
        self._extend(self.text.feed(text))

    def end_text(self) -> None:
        """The text is complete (ignored if it already is)."""
        if self.text_done:
            return
        self._extend(self.text.finish())
        self.text_done = True

    def _extend(self, ids: list[int]) -> None:
        self.track += ids
        self.text_tokens += len(ids)

    def add_frame(self, frame: torch.Tensor, on_frame: FrameHook | None) -> bool:
        """Buffer a generated frame; at `max_frames` the request finishes ("length"). Returns whether it goes on."""
        self.buffer.append(frame)
        self.n_frames += 1
        if on_frame is not None:
            on_frame(self.rid, frame)
        if self.n_frames >= self.max_frames:
            self.finish_reason = "length"
            self.token = None
            return False
        return True


class Admission:
    """Validates a `SpeechRequest` against the checkpoint (task, language, voice, instructions, sampling) and
    turns it into a `Request`; refusals raise `RequestError` naming the offending parameter."""

    def __init__(self, model: Qwen3TTSModel, task: str, default_voice: str, max_instruction_tokens: int,
                 cloning: VoiceCloning) -> None:
        self.model = model
        self.task = task
        self.default_voice = default_voice
        self.max_instruction_tokens = max_instruction_tokens
        self.cloning = cloning

    def new_request(self, request: SpeechRequest) -> Request:
        spec = self._voice_spec(request)
        talker, predictor, generator, seed, max_frames = self._sampling(request)
        if request.initial_codec_chunk_frames is not None and request.initial_codec_chunk_frames < 1:
            raise RequestError("initial_codec_chunk_frames must be >= 1", param="initial_codec_chunk_frames")
        if request.text_complete and not request.text.strip():
            raise RequestError("input text is empty", param="input")
        req = Request(
            rid=request.request_id, spec=spec, talker_sampling=talker, predictor_sampling=predictor,
            generator=generator, seed=seed, max_frames=max_frames, text=IncrementalText(self.model.tokenizer),
            initial_chunk=request.initial_codec_chunk_frames,
        )
        if spec.ref_codes is not None and not spec.non_streaming:
            req.track = list(spec.ref_text_ids)
        req.feed(request.text)
        if request.text_complete:
            req.end_text()
        return req

    def _voice_spec(self, r: SpeechRequest) -> VoiceSpec:
        cfg = self.model.cfg
        tc = cfg.talker
        task = self.task
        if r.task_type:
            asked = TASK_ALIASES.get(r.task_type.strip().lower().replace("-", "_").replace(" ", "_"))
            if asked is None:
                raise RequestError(f"unknown task_type {r.task_type!r}; this model serves {task!r}",
                                   param="task_type")
            if asked != task:
                raise RequestError(f"task_type {asked!r} is not supported by this checkpoint ({task!r})",
                                   param="task_type")
        if r.speaker_embedding is not None and task != "base":
            raise RequestError(f"speaker_embedding needs a Base checkpoint; this one serves {task!r}",
                               param="speaker_embedding")
        lang = (r.language or "auto").strip().lower()
        if lang not in cfg.languages:
            raise RequestError(f"unsupported language {r.language!r}; supported: {', '.join(cfg.languages)}",
                               param="language")
        language_id = None if lang == "auto" else int(tc.codec_language_id[lang])
        spec = VoiceSpec(task=task, language_id=language_id)
        instructions = (r.instructions or "").strip()
        if task == "custom_voice":
            speakers = {k.lower(): k for k in tc.spk_id}
            voice = speaker_for(r.voice or self.default_voice, tc.spk_id).strip().lower()
            if voice not in speakers:
                raise RequestError(f"unknown voice {r.voice!r}; available: {', '.join(sorted(speakers))}",
                                   param="voice")
            key = speakers[voice]
            spec.speaker_id = tc.spk_id[key]
            dialect = tc.spk_is_dialect.get(key, False)
            if lang in ("chinese", "auto") and dialect:
                spec.language_id = int(tc.codec_language_id[dialect])
            if cfg.tts_model_size and cfg.tts_model_size in "0b6":
                instructions = ""  # upstream: the 0.6B CustomVoice model takes no instructions
            spec.non_streaming = True
        elif task == "voice_design":
            spec.non_streaming = True
        else:
            instructions = ""  # upstream's voice clone takes no instructions
            self.cloning.apply(r, spec)
        if instructions:
            ids = self.model.tokenizer.instruct_ids(instructions)
            if len(ids) > self.max_instruction_tokens:
                raise RequestError(
                    f"instructions are too long ({len(ids)} tokens; at most {self.max_instruction_tokens})",
                    param="instructions")
            spec.instruct_ids = ids
        if not r.text_complete:
            spec.non_streaming = False  # text arrives while audio is generated
        return spec

    def _sampling(
        self, r: SpeechRequest
    ) -> tuple[SamplerSettings, SamplerSettings, torch.Generator | None, int, int]:
        """The talker's and the code predictor's sampling, the request's generator (None: both greedy), its seed
        (the request's, else random; 0 when greedy) and its frame limit, from the request's overrides over the
        checkpoint's generation defaults."""
        g = self.model.generation
        s = r.sampling
        temperature = g["temperature"] if s.temperature is None else s.temperature
        top_k = g["top_k"] if s.top_k is None else s.top_k
        top_p = g["top_p"] if s.top_p is None else s.top_p
        rep = g["repetition_penalty"] if s.repetition_penalty is None else s.repetition_penalty
        max_new = g["max_new_tokens"] if s.max_new_tokens is None else s.max_new_tokens
        if temperature < 0:
            raise RequestError("temperature must be >= 0 (0 is greedy)", param="temperature")
        if top_k < 0:
            raise RequestError("top_k must be >= 0", param="top_k")
        if not 0.0 < top_p <= 1.0:
            raise RequestError("top_p must be in (0, 1]", param="top_p")
        if rep <= 0:
            raise RequestError("repetition_penalty must be > 0", param="repetition_penalty")
        if max_new < 1:
            raise RequestError("max_new_tokens must be >= 1", param="max_new_tokens")
        greedy = temperature < MIN_TEMPERATURE or not g.get("do_sample", True)
        talker = SamplerSettings(0.0 if greedy else float(temperature), int(top_k), float(top_p), float(rep))
        sub_greedy = temperature < MIN_TEMPERATURE or not g.get("subtalker_dosample", True)
        predictor = SamplerSettings(0.0 if sub_greedy else float(g["subtalker_temperature"]),
                                    int(g["subtalker_top_k"]), float(g["subtalker_top_p"]), 1.0)
        gen, seed = None, 0
        if not (talker.greedy and predictor.greedy):
            seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            gen = torch.Generator(device=self.model.device)
            gen.manual_seed(seed)
        return talker, predictor, gen, seed, int(max_new)

"""Engine runner for Qwen3-TTS-12Hz: continuous batching over a preallocated KV cache.

Each step:
1. prefill: requests whose prompt can be built (enough text has arrived) get a free
   KV slot, run their prompt through the talker and pick their first codebook-0 id
   (on the fast path all of a step's prompts go through in one padded forward);
2. decode: every request whose next text-track item is known runs one frame: the
   code predictor fills codebooks 1..15 (batched, fresh 17-position cache), then the
   talker consumes the frame's summed embeddings plus the text track and picks the
   next codebook-0 id (batched over slots of different lengths with a key mask).
   A request still waiting for its next text token is skipped: it burns no pad;
3. chunking: buffered frames go to the streaming codec decoder in one batched call
   (first chunk `initial_codec_chunk_frames` or 1 frame, then doubling up to
   `codec_chunk_frames`) and the new samples are sent with `sink.audio`.
GPU fast path (`cuda_graphs.FrameStepper`, on by default on CUDA; env `STREAMVOX_QWEN3_FAST`=0/1 forces
it off/on): greedy requests keep their pending id and hidden state in slot-indexed device buffers, and
each step is one CUDA-graph replay per (row bucket, attention width) with no host sync; the chosen ids
are read back asynchronously one step later to notice end-of-speech (that wait also keeps the host at
most one step ahead of the GPU). Prefills of up to 512 positions replay a graph per (rows, length) bucket.
On CUDA the codec decoder is a `codec_graphs.GraphedDecoder` (graphs per (rows, frames) bucket, carried
state in slot buffers): first chunks decode on the AR stream, which has high priority, and later chunks on
a low-priority decoder stream; PCM reaches pinned memory asynchronously, so decoding overlaps the next AR
steps. Env `STREAMVOX_QWEN3_IGNORE_EOS=1` never lets end-of-speech be chosen (fixed-length output for
benchmarks with random weights). Other knobs: `STREAMVOX_QWEN3_CUDA_GRAPHS=0` (fast path without graphs),
`STREAMVOX_QWEN3_COMPILE=0` (no torch.compile of the fused layer halves), `STREAMVOX_QWEN3_KERNEL_MAX_ROWS` (the
largest frame step on the Triton decode kernels, default all), `STREAMVOX_QWEN3_WARMUP_WIDTHS` (attention widths
whose graphs are captured at load, default "256,512"; others are captured on first use),
`STREAMVOX_QWEN3_DECODER_SMS` (multiprocessors the one-row kernels leave free for the decoder's kernels to run
beside them, default 0: `kernel_build.kernel_grid`), `STREAMVOX_QWEN3_CODEC_DTYPE` (codec decoder dtype: float32,
float16, bfloat16, or by default auto: float16 on CUDA if it decodes as float32 does on the checkpoint, see
`_load_codec`), `STREAMVOX_QWEN3_BATCH_PREFILL=0` (fast-path prompts one at a time instead of one padded forward per
step), `STREAMVOX_QWEN3_CODEC_COMPILE=0` (no fused SnakeBeta in the decoder), `STREAMVOX_QWEN3_CODEC_GRAPHS=0/1`
(the plain `Code2Wav` decoder on CUDA / the slot decoder, run eagerly, on the CPU), `STREAMVOX_QWEN3_TIMING=1` (log
host and GPU time per step phase, per-request waits and every host sync, every `STREAMVOX_QWEN3_TIMING_STEPS` engine
steps: `step_timing`).
Everything a request owns (slot, text, generator, frame buffer, codec state) lives in
its `_Request` and is dropped on finish, failure or `release`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from streamvox.contract import ModelInfo, OutputSink, RequestError, SpeechRequest
from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav, agreement_db
from streamvox.models.qwen3_tts.codec.graphed import GraphedDecoder
from streamvox.models.qwen3_tts.model.modules import DenseCache
from streamvox.models.qwen3_tts.model.prompt import Qwen3TTSModel, VoiceSpec
from streamvox.models.qwen3_tts.openai_voices import served_voices, speaker_for
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper, row_bucket, width_bucket
from streamvox.models.qwen3_tts.runtime.timing import StepTiming
from streamvox.models.qwen3_tts.sampling import SamplerSettings, apply_repetition_penalty, select
from streamvox.models.qwen3_tts.speaker import resample
from streamvox.models.qwen3_tts.text import IncrementalText

log = logging.getLogger(__name__)

TASK_ALIASES = {
    "custom_voice": "custom_voice", "customvoice": "custom_voice", "custom": "custom_voice",
    "voice_design": "voice_design", "voicedesign": "voice_design", "design": "voice_design",
    "base": "base", "voice_clone": "base", "clone": "base",
}
MIN_NEW_TOKENS = 2  # upstream forbids end-of-speech for the first two codebook-0 ids
POLL_INTERVAL_S = 2e-4  # while waiting for the GPU with decoder calls in flight
BLOCK_MAX_S = 1e-3  # with nothing but decoder calls in flight, the longest wait before the engine looks for requests


class StreamingCodec(Protocol):
    """What the runner needs from the codec decoder (the speech tokenizer's code2wav)."""

    @property
    def sample_rate(self) -> int: ...

    @property
    def samples_per_frame(self) -> int: ...

    def new_stream_state(self) -> Any: ...

    def decode_stream(self, codes_list: list[torch.Tensor], states: list[Any]) -> list[torch.Tensor]:
        """codes_list[i]: `[G, t_i]` next frames of request i; returns its new samples `[t_i * spf]`."""
        ...

    def release_stream(self, state: Any) -> None:
        """The request is gone: free what its state holds."""
        ...


ReferenceEncoder = Callable[[np.ndarray, int], torch.Tensor]  # (pcm, sr) -> LongTensor [T, G]


class _SlotCache:
    """Preallocated keys/values `[layers, slots, kv_heads, max_len, head_dim]`."""

    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len


class _PrefillView:
    """One request's prompt written into its slot at positions 0..L-1."""

    def __init__(self, cache: _SlotCache, slot: int) -> None:
        self.cache, self.slot = cache, slot

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[2]
        self.cache.k[layer, self.slot, :, :n] = k[0]
        self.cache.v[layer, self.slot, :, :n] = v[0]
        return k, v


class _DecodeView:
    """One new position per row, each row in its own slot at its own length."""

    def __init__(self, cache: _SlotCache, slots: torch.Tensor, pos: torch.Tensor) -> None:
        self.cache, self.slots, self.pos = cache, slots, pos
        self.width = int(pos.max()) + 1

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.k[layer, self.slots, :, self.pos] = k[:, :, 0]
        self.cache.v[layer, self.slots, :, self.pos] = v[:, :, 0]
        w = self.width
        return self.cache.k[layer, self.slots, :, :w], self.cache.v[layer, self.slots, :, :w]

    def mask(self) -> torch.Tensor:
        ar = torch.arange(self.width, device=self.pos.device)
        return (ar[None, :] <= self.pos[:, None])[:, None, None, :]


@dataclass
class _ClonedVoice:
    """What voice cloning derives from reference audio, computed once per registered voice."""

    speaker_embedding: torch.Tensor
    ref_codes: torch.Tensor | None = None  # in-context cloning: `[T, G]`
    ref_text_ids: list[int] = field(default_factory=list)


@dataclass
class _Request:
    rid: str
    spec: VoiceSpec
    talker_settings: SamplerSettings
    sub_settings: SamplerSettings
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
    inflight: int = 0  # decoder calls whose audio has not been sent yet
    text_tokens: int = 0  # ids of the text to speak (usage: input_tokens)
    has_words: bool = False  # any non-whitespace text seen
    created: float = field(default_factory=time.perf_counter)
    audio_sent: bool = False

    @property
    def decoding(self) -> bool:
        return self.token is not None and self.finish_reason is None


class Qwen3TTSRunner:
    """`Runner` for a Qwen3-TTS-12Hz checkpoint (CustomVoice, VoiceDesign or Base)."""

    def __init__(
        self,
        model: Qwen3TTSModel,
        codec: StreamingCodec | None = None,
        *,
        reference_encoder: ReferenceEncoder | None = None,
        max_batch: int = 16,
        max_seq_len: int = 2048,
        codec_chunk_frames: int = 25,
        max_instruction_tokens: int = 512,
        max_ref_audio_seconds: float = 60.0,
        on_frame: Callable[[str, torch.Tensor], None] | None = None,
        name: str | None = None,
        max_prefill_tokens: int = 16384,
    ) -> None:
        self.model = model
        self.reference_encoder = reference_encoder
        self.max_batch = max_batch
        self.codec_chunk_frames = codec_chunk_frames
        self.max_instruction_tokens = max_instruction_tokens
        self.max_ref_audio_seconds = max_ref_audio_seconds
        self.on_frame = on_frame
        # Batched prefill (fast path): at most this many prompts / padded positions per forward.
        # STREAMVOX_QWEN3_BATCH_PREFILL=0 runs the fast path's prompts one at a time.
        self._timing = (StepTiming(int(os.environ.get("STREAMVOX_QWEN3_TIMING_STEPS", "250")))
                        if os.environ.get("STREAMVOX_QWEN3_TIMING", "0") == "1" else None)
        self.batch_prefill = os.environ.get("STREAMVOX_QWEN3_BATCH_PREFILL", "1") != "0"
        self.max_prefill_batch = max_batch if self.batch_prefill else 1
        self.max_prefill_tokens = max_prefill_tokens
        cfg = model.cfg
        self.task = cfg.tts_model_type or "custom_voice"
        tc = cfg.talker
        assert tc.code_predictor is not None
        self.groups = tc.num_code_groups
        # one slot more than requests: the fast path's scratch slot (padded rows of a batched prefill)
        self.cache = _SlotCache(tc.num_hidden_layers, max_batch + 1, tc.num_key_value_heads, max_seq_len,
                                tc.head_dim, model.dtype, model.device)
        self.free_slots = list(range(max_batch))
        self.requests: dict[str, _Request] = {}
        self.order: list[str] = []  # admission order (prefill is first come, first served)
        self.cloned_voices: dict[str, _ClonedVoice] = {}  # Base: voices registered with `add_voice`
        v = tc.vocab_size
        self.suppress = torch.zeros(v, dtype=torch.bool, device=model.device)
        self.suppress[max(0, v - 1024):] = True
        self.suppress[tc.codec_eos_token_id] = False
        self.ignore_eos = os.environ.get("STREAMVOX_QWEN3_IGNORE_EOS", "0") == "1"
        if self.ignore_eos:
            self.suppress[tc.codec_eos_token_id] = True
        fast = os.environ.get("STREAMVOX_QWEN3_FAST", "auto")
        use_fast = fast == "1" or (fast == "auto" and model.device.type == "cuda")
        self.stepper = (FrameStepper(model, self.cache, self.suppress, tc.codec_eos_token_id, MIN_NEW_TOKENS)
                        if use_fast else None)
        self._pending_tok: tuple[torch.Tensor | None, Any, dict[int, _Request]] | None = None
        self._inflight: list[tuple[Any, torch.Tensor, list[tuple[_Request, int, int]]]] = []
        # CUDA: the AR work (prefill, frame steps) and first chunks run on a high-priority stream, the
        # other decoder calls on a low-priority one, so a busy decoder delays a new request's first audio
        # as little as possible.
        cuda = model.device.type == "cuda"
        self.ar_stream = torch.cuda.Stream(model.device, priority=-1) if cuda else None
        self.dec_stream = torch.cuda.Stream(model.device, priority=0) if cuda else None
        graphs = os.environ.get("STREAMVOX_QWEN3_CODEC_GRAPHS", "auto")
        if isinstance(codec, Code2Wav) and (graphs == "1" or (graphs == "auto" and cuda)):
            lanes = (min(2, codec_chunk_frames), codec_chunk_frames)  # first chunks; the rest
            codec = GraphedDecoder(codec, slots=2 * max_batch, max_rows=max_batch, lane_frames=lanes)
            codec.warmup()
        elif cuda and isinstance(codec, Code2Wav):
            codec.check_codes = False  # our codes come from the model's heads: always in range (no host sync)
        self.codec = codec
        if self._timing is not None and isinstance(codec, GraphedDecoder):
            self._timing.notes.append(codec.usage)
        if self.stepper is not None and self.stepper.use_graphs:
            warm = os.environ.get("STREAMVOX_QWEN3_WARMUP_WIDTHS", "256,512")
            widths = tuple(width_bucket(int(w), max_seq_len) for w in warm.split(",") if w.strip())
            self.stepper.warmup(max_batch, widths)
        if self._timing is not None and cuda:
            torch.cuda.set_sync_debug_mode("warn")  # name every host sync in the engine (one warning per line)
        sr = codec.sample_rate if codec is not None else 24000
        speakers = sorted(cfg.speakers)
        self.info = ModelInfo(
            name=name or (model.model_dir.name if model.model_dir else "qwen3-tts"),
            family="qwen3_tts",
            sample_rate=sr,
            voices=served_voices(self.task, speakers),  # with OpenAI's voice names (qwen3_tts/openai_voices.py)
            default_voice=speakers[0] if (self.task == "custom_voice" and speakers) else "default",
            languages=cfg.languages,
            task_types=[self.task],
            streaming_text=True,
            native_speed=False,
            voice_cloning=self.task == "base",
        )

    def _on_ar_stream(self) -> contextlib.AbstractContextManager:
        """Device work of the engine thread runs on the AR stream (CUDA), so it needs no cross-stream syncs."""
        return torch.cuda.stream(self.ar_stream) if self.ar_stream is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ admission

    def add(self, request: SpeechRequest) -> None:
        t0 = time.perf_counter()
        with self._on_ar_stream():
            self._add(request)
        if self._timing is not None:
            self._timing.add("add_request", time.perf_counter() - t0, 1)

    def _add(self, request: SpeechRequest) -> None:
        rid = request.request_id
        if rid in self.requests:
            raise RequestError(f"request id {rid!r} is already active", param="request_id")
        spec = self._voice_spec(request)
        talker, sub, generator, max_frames = self._sampling(request)
        if request.initial_codec_chunk_frames is not None and request.initial_codec_chunk_frames < 1:
            raise RequestError("initial_codec_chunk_frames must be >= 1", param="initial_codec_chunk_frames")
        if request.text_complete and not request.text.strip():
            raise RequestError("input text is empty", param="input")
        req = _Request(
            rid=rid, spec=spec, talker_settings=talker, sub_settings=sub, generator=generator,
            max_frames=max_frames, text=IncrementalText(self.model.tokenizer),
            initial_chunk=request.initial_codec_chunk_frames,
        )
        if spec.ref_codes is not None and not spec.non_streaming:
            req.track = list(spec.ref_text_ids)
        req.has_words = bool(request.text.strip())
        if request.text_complete:
            self._extend(req, req.text.feed(request.text) + req.text.finish())
            req.text_done = True
        else:
            self._extend(req, req.text.feed(request.text))
        self.requests[rid] = req
        self.order.append(rid)

    def feed_text(self, request_id: str, text: str) -> None:
        req = self.requests.get(request_id)
        if req is None or req.text_done:
            return
        req.has_words = req.has_words or bool(text.strip())
        self._extend(req, req.text.feed(text))

    def end_input(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is None or req.text_done:
            return
        self._extend(req, req.text.finish())
        req.text_done = True

    @staticmethod
    def _extend(req: _Request, ids: list[int]) -> None:
        req.track += ids
        req.text_tokens += len(ids)

    def release(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        self.order.remove(request_id)
        if req.slot is not None:
            self.free_slots.append(req.slot)
            self.free_slots.sort()  # lowest slots first: the fast path's row count is the highest busy slot
            req.slot = None
        req.buffer.clear()
        if req.codec_state is not None and self.codec is not None:
            self.codec.release_stream(req.codec_state)
        req.codec_state = None
        req.hidden = None

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
        lang = (r.language or "auto").strip().lower()
        if lang not in cfg.languages:
            raise RequestError(f"unsupported language {r.language!r}; supported: {', '.join(cfg.languages)}",
                               param="language")
        language_id = None if lang == "auto" else int(tc.codec_language_id[lang])
        spec = VoiceSpec(task=task, language_id=language_id)
        instructions = (r.instructions or "").strip()
        if task == "custom_voice":
            speakers = {k.lower(): k for k in tc.spk_id}
            voice = speaker_for(r.voice or self.info.default_voice, tc.spk_id).strip().lower()
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
            self._reference(r, spec)
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

    def _reference(self, r: SpeechRequest, spec: VoiceSpec) -> None:
        if r.ref_audio:
            voice = self._analyse_reference(r.ref_audio, r.ref_sample_rate, r.ref_text)
        elif r.voice:
            voice = self.cloned_voices.get(r.voice)
            if voice is None:
                known = ", ".join(sorted(self.cloned_voices)) or "none yet; POST /v1/audio/voices adds one"
                raise RequestError(f"unknown voice {r.voice!r}; cloned voices: {known}", param="voice")
        else:
            raise RequestError("voice cloning needs ref_audio (mono float32 PCM) or the name of a cloned voice",
                               param="ref_audio")
        spec.speaker_embedding = voice.speaker_embedding
        if voice.ref_codes is not None:
            spec.ref_codes = voice.ref_codes
            spec.ref_text_ids = list(voice.ref_text_ids)
        spec.non_streaming = False  # upstream's voice clone default

    def _analyse_reference(self, ref_audio: bytes, sr: int | None, ref_text: str | None) -> _ClonedVoice:
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
            voice = _ClonedVoice(self.model.speaker_embedding(pcm, sr))
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

    # ------------------------------------------------------------------ cloned voices

    @torch.inference_mode()
    def add_voice(self, name: str, ref_audio: bytes, sample_rate: int, ref_text: str | None = None) -> None:
        """Register a cloned voice (Base checkpoints): its embedding and reference codes are computed
        once here, and a request whose `voice` is `name` uses them. Replaces a voice of that name."""
        if self.task != "base":
            raise RequestError(f"model does not support voice cloning (a {self.task!r} checkpoint)",
                               param="audio", code="voice_cloning_unsupported")
        with self._on_ar_stream():
            self.cloned_voices[name] = self._analyse_reference(ref_audio, sample_rate, ref_text)

    def remove_voice(self, name: str) -> None:
        """Forget a cloned voice; requests already admitted with it keep their copy."""
        self.cloned_voices.pop(name, None)

    def _sampling(
        self, r: SpeechRequest
    ) -> tuple[SamplerSettings, SamplerSettings, torch.Generator | None, int]:
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
        greedy = temperature == 0 or not g.get("do_sample", True)
        talker = SamplerSettings(0.0 if greedy else float(temperature), int(top_k), float(top_p), float(rep))
        sub_greedy = temperature == 0 or not g.get("subtalker_dosample", True)
        sub = SamplerSettings(0.0 if sub_greedy else float(g["subtalker_temperature"]),
                              int(g["subtalker_top_k"]), float(g["subtalker_top_p"]), 1.0)
        gen = None
        if not (talker.greedy and sub.greedy):
            gen = torch.Generator(device=self.model.device)
            gen.manual_seed(s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        return talker, sub, gen, int(max_new)

    # ------------------------------------------------------------------ stepping

    def has_work(self) -> bool:
        if self._inflight or self._pending_tok is not None:
            return True
        for req in self.requests.values():
            if req.finish_reason is not None or req.buffer and self._chunk_due(req):
                return True
            if req.slot is None:
                if self.free_slots and self.model.prompt_ready(req.spec, req.track, req.text_done):
                    return True
            elif req.decoding and self._can_decode(req):
                return True
        return False

    @torch.inference_mode()
    def step(self, sink: OutputSink) -> None:
        with self._on_ar_stream():
            self._step(sink)

    def _step(self, sink: OutputSink) -> None:
        tm = self._timing
        t0 = time.perf_counter()
        ready: list[_Request] = []
        for rid in list(self.order):
            if len(ready) >= len(self.free_slots):
                break
            req = self.requests.get(rid)
            if req is None or req.slot is not None or req.finish_reason is not None:
                continue
            if self.model.prompt_ready(req.spec, req.track, req.text_done):
                ready.append(req)
        if ready:
            self._prefill(ready, sink)
        t1 = time.perf_counter()
        batch = [r for r in (self.requests[i] for i in self.order) if r.decoding and self._can_decode(r)]
        slow = [r for r in batch if not r.fast]
        fast = [r for r in batch if r.fast]
        if slow:
            self._decode(slow)
        if fast or self._pending_tok is not None:
            self._decode_fast(fast, sink)
        t2 = time.perf_counter()
        self._emit(sink, block=not batch)
        if tm is not None:
            t3 = time.perf_counter()
            tm.add("prefill", t1 - t0, len(ready))
            tm.add("decode", t2 - t1, len(batch))
            tm.add("emit", t3 - t2)
            tm.add("step", t3 - t0)  # last: it counts the step and logs each window

    def _can_decode(self, req: _Request) -> bool:
        if req.n_frames + 1 >= req.max_frames or req.offset is None:
            return True  # no text needed (last frame, or pad-only track)
        return req.text_done or req.offset < len(req.track)

    def _prefill(self, ready: list[_Request], sink: OutputSink) -> None:
        """Admit the ready requests (first come, first served) into free slots and run their prompts.

        Fast-path (greedy) prompts go through the talker together, in groups of at most
        `max_prefill_batch` prompts and `max_prefill_tokens` padded positions (one forward each), so a
        burst of arrivals costs one prefill rather than one per request; the others run one by one."""
        group: list[tuple[_Request, torch.Tensor]] = []
        for req in ready:
            t0 = time.perf_counter()
            try:
                embeds = self._admit(req)
                if self._timing is not None:
                    self._timing.add("build_prompt", time.perf_counter() - t0, 1)
            except RequestError as e:
                self.release(req.rid)
                sink.failed(req.rid, e)
                continue
            if not req.fast:
                self._prefill_eager(req, embeds)
                continue
            longest = max([embeds.shape[0]] + [e.shape[0] for _, e in group])
            if group and (len(group) >= self.max_prefill_batch
                          or longest * (len(group) + 1) > self.max_prefill_tokens):
                self._prefill_fast(group)
                group = []
            group.append((req, embeds))
        if group:
            self._prefill_fast(group)

    def _admit(self, req: _Request) -> torch.Tensor:
        """Build the prompt, take a KV slot and set the request's positions; returns the prompt embeddings."""
        if req.text_done and not req.has_words:
            raise RequestError("input text is empty", param="input")
        prompt = self.model.build_prompt(req.spec, req.track, req.text_done)
        n = prompt.embeds.shape[0]
        req.max_frames = min(req.max_frames, self.cache.max_len - n)
        if req.max_frames < 1:
            raise RequestError(f"prompt of {n} positions leaves no room in the {self.cache.max_len}-position "
                               "cache", param="input")
        req.slot = self.free_slots.pop(0)
        if self._timing is not None:
            self._timing.latency["admit"].append(time.perf_counter() - req.created)
        req.prompt_tokens = n
        req.length, req.offset = n, prompt.track_offset
        req.fast = self.stepper is not None and req.talker_settings.greedy and req.sub_settings.greedy
        return prompt.embeds

    def _prefill_fast(self, group: list[tuple[_Request, torch.Tensor]]) -> None:
        st = self.stepper
        assert st is not None
        for req, _ in group:
            st.reset_slot(req.slot, req.talker_settings.repetition_penalty)  # type: ignore[arg-type]
        if len(group) == 1 and not self.batch_prefill:
            req, embeds = group[0]
            last = st.prefill(req.slot, embeds)  # type: ignore[arg-type]
            st.prefill_done(req.slot, embeds.shape[0], last)  # type: ignore[arg-type]
        else:
            st.prefill_batch([r.slot for r, _ in group], [e for _, e in group])  # type: ignore[misc]
        for req, _ in group:
            req.token = 0  # the real id stays on the device (MIN_NEW_TOKENS rules out end-of-speech here)
            req.history.append(0)

    def _prefill_eager(self, req: _Request, embeds: torch.Tensor) -> None:
        n = embeds.shape[0]
        pos = torch.arange(n, device=self.model.device)[None]
        h = self.model.talker.model.run(embeds[None], pos, _PrefillView(self.cache, req.slot))  # type: ignore[arg-type]
        req.hidden = h[0, -1]
        logits = self.model.talker.codec_head(req.hidden).float()
        self._choose(req, logits)

    def _choose(self, req: _Request, logits: torch.Tensor) -> None:
        """Pick the next codebook-0 id (or end the request on end-of-speech)."""
        eos = self.model.cfg.talker.codec_eos_token_id
        history = torch.tensor(req.history, dtype=torch.long, device=logits.device)
        logits = apply_repetition_penalty(logits, history, req.talker_settings.repetition_penalty)
        mask = self.suppress
        if len(req.history) < MIN_NEW_TOKENS:
            mask = mask.clone()
            mask[eos] = True
        logits = logits.masked_fill(mask, float("-inf"))
        tok = select(logits, req.talker_settings, req.generator)
        req.history.append(tok)
        if tok == eos:
            req.token = None
            req.finish_reason = "stop"
        else:
            req.token = tok

    def _predict_frames(self, batch: list[_Request]) -> torch.Tensor:
        """Code predictor: codebooks 1..G-1 for each row. Returns frames `[B, G]`."""
        talker = self.model.talker
        cp = talker.code_predictor
        dev = self.model.device
        first = torch.tensor([r.token for r in batch], dtype=torch.long, device=dev)
        hidden = torch.stack([r.hidden for r in batch])  # type: ignore[misc]
        x = torch.stack([hidden, talker.model.codec_embedding(first)], dim=1)
        cache = DenseCache()
        all_greedy = all(r.sub_settings.greedy for r in batch)
        codes = [first]
        pos = torch.arange(2, device=dev)[None].expand(len(batch), -1)
        for j in range(self.groups - 1):
            h = cp.model.run(cp.small_to_mtp_projection(x), pos, cache)
            logits = cp.lm_head[j](h[:, -1]).float()
            if all_greedy:
                tok = logits.argmax(-1)  # one kernel, no per-row host round trips
            else:
                picked = [select(logits[i], r.sub_settings, r.generator) for i, r in enumerate(batch)]
                tok = torch.tensor(picked, dtype=torch.long, device=dev)
            codes.append(tok)
            if j + 1 < self.groups - 1:
                x = cp.model.codec_embedding[j](tok)[:, None]
                pos = torch.full((len(batch), 1), j + 2, dtype=torch.long, device=dev)
        return torch.stack(codes, dim=1)

    def _add_frame(self, req: _Request, frame: torch.Tensor) -> bool:
        """Buffer a generated frame; at `max_frames` the request finishes ("length"). Returns whether it goes on."""
        req.buffer.append(frame)
        req.n_frames += 1
        if self.on_frame is not None:
            self.on_frame(req.rid, frame)
        if req.n_frames >= req.max_frames:
            req.finish_reason = "length"
            req.token = None
            return False
        return True

    def _decode(self, batch: list[_Request]) -> None:
        frames = self._predict_frames(batch)
        cont: list[_Request] = []
        rows: list[int] = []
        for i, req in enumerate(batch):
            if self._add_frame(req, frames[i]):
                cont.append(req)
                rows.append(i)
        if not cont:
            return
        talker = self.model.talker
        dev = self.model.device
        x = talker.frame_embed(frames[rows])
        text = []
        for req in cont:
            if req.offset is None:
                text.append(self.model.tts_pad)
            else:
                text.append(self.model.track_embed(req.track, req.offset, req.text_done))
                req.offset += 1
        x = (x + torch.stack(text))[:, None]
        slots = torch.tensor([r.slot for r in cont], dtype=torch.long, device=dev)
        pos = torch.tensor([r.length for r in cont], dtype=torch.long, device=dev)
        view = _DecodeView(self.cache, slots, pos)
        h = talker.model.run(x, pos[:, None], view, view.mask())[:, 0]
        logits = talker.codec_head(h).float()
        for i, req in enumerate(cont):
            req.length += 1
            req.hidden = h[i]
            self._choose(req, logits[i])

    def _decode_fast(self, batch: list[_Request], sink: OutputSink) -> None:
        """One frame for every request in `batch` through the slot-indexed stepper (see cuda_graphs)."""
        st = self.stepper
        assert st is not None
        launched = None
        if batch:
            busy = [r for r in self.requests.values() if r.fast and r.slot is not None]
            rows = row_bucket(max(r.slot for r in busy) + 1, self.max_batch)  # type: ignore[type-var]
            width = width_bucket(max(r.length + 1 for r in busy if r.slot < rows), self.cache.max_len)
            cfg = self.model.cfg
            active = [False] * rows
            ids = [cfg.tts_pad_token_id] * rows
            for req in batch:
                slot = req.slot
                assert slot is not None
                active[slot] = True
                if req.offset is not None:
                    i = req.offset
                    ids[slot] = (req.track[i] if i < len(req.track)
                                 else cfg.tts_eos_token_id if i == len(req.track) else cfg.tts_pad_token_id)
                    req.offset += 1
            st.set_inputs(active, ids, rows)
            span = self._gpu_span(f"frame_step_{rows}", self.ar_stream)
            st.step(rows, width)
            span()
            frames = st.frames[:rows].clone()
            if self.dec_stream is not None:
                frames.record_stream(self.dec_stream)  # the decoder stream reads these later
            launched = frames
            # The chosen ids come back to pinned memory asynchronously; the next step waits for them. That
            # wait also keeps the host at most one step ahead of the GPU, so a new request's prefill is
            # never queued behind a backlog of frame steps; with end-of-speech ignored it still waits.
            tok = st.token[:rows]
            host = None
            if not self.ignore_eos:
                host = torch.empty(tok.shape, dtype=tok.dtype, pin_memory=tok.is_cuda)
                host.copy_(tok, non_blocking=True)
            event = None
            if tok.is_cuda:
                event = torch.cuda.Event()
                event.record()
            pending = (host, event, {r.slot: r for r in batch})  # type: ignore[misc]
        # End-of-speech chosen by the previous step: those requests get no frame from this one.
        eos = self.model.cfg.talker.codec_eos_token_id
        if self._pending_tok is not None:
            host, event, reqs = self._pending_tok
            if event is not None:
                self._wait(event, sink)
            ids_prev = host.tolist() if host is not None else []  # none: end-of-speech is ignored
            for slot, req in reqs.items() if ids_prev else ():
                if ids_prev[slot] == eos and req.finish_reason is None and req.slot == slot:
                    req.finish_reason = "stop"
                    req.token = None
            self._pending_tok = None
        if launched is None:
            return
        for req in batch:
            if req.finish_reason is not None:
                continue
            req.length += 1
            self._add_frame(req, launched[req.slot])
        self._pending_tok = pending

    def _wait(self, event: torch.cuda.Event, sink: OutputSink) -> None:
        """Wait for the previous frame step (done or nearly, as this one is queued); meanwhile send the
        audio of decoder calls as they finish, so a first chunk does not wait for the next step."""
        if not self._inflight:
            event.synchronize()
            return
        while not event.query():
            self._poll(sink, block=False)
            time.sleep(POLL_INTERVAL_S)

    # ------------------------------------------------------------------ audio

    def _first_chunk(self, req: _Request) -> int:
        if req.initial_chunk is not None:
            return req.initial_chunk
        # One frame, for latency; the chunks after it double (see `_chunk_size`), so the number of decoder
        # calls per request stays small.
        return 1

    def _chunk_size(self, req: _Request) -> int:
        """Frames in the request's next chunk: the first chunk, then doubling up to `codec_chunk_frames`
        (e.g. 1, 2, 4, 8, 16, 25, 25, ...). Each chunk's audio lasts as long as the time to generate
        the next at >= 2x real time, so playback never waits for a chunk once it has started."""
        if req.chunks == 0:
            return self._first_chunk(req)
        return min(self.codec_chunk_frames, req.first_chunk << min(req.chunks, 16))

    def _chunk_due(self, req: _Request) -> bool:
        if req.finish_reason is not None:
            return True
        return len(req.buffer) >= self._chunk_size(req)

    def _emit(self, sink: OutputSink, block: bool = False) -> None:
        due = [r for r in (self.requests[i] for i in self.order) if (r.buffer and self._chunk_due(r))]
        if due and isinstance(self.codec, GraphedDecoder) and self.dec_stream is not None:
            # first chunks: lane 0 on the AR stream (high priority); the rest: lane 1 on the decoder stream
            small = self.codec.lane_frames(0)
            first = [r for r in due if r.codec_state is None and r.spec.ref_codes is None and len(r.buffer) <= small]
            if first:
                self._decode_async(first, None, lane=0)
            rest = [r for r in due if r not in first]
            if rest:
                self._decode_async(rest, self.dec_stream, lane=1)
        elif due and self.codec is not None and self.dec_stream is not None:
            self._decode_async(due, self.dec_stream)
        elif due and self.codec is not None:
            for req, piece in zip(due, self._decode_chunks(due), strict=True):
                pcm = piece.float().cpu().numpy()
                if pcm.size:
                    self._send_audio(sink, req, pcm)
        for req in due:
            if req.chunks == 0:
                req.first_chunk = len(req.buffer)
            req.buffer.clear()
            req.chunks += 1
        self._poll(sink, block and not due)
        for rid in list(self.order):
            req = self.requests[rid]
            if req.finish_reason is not None and not req.buffer and not req.inflight:
                reason, n_in, n_out = req.finish_reason, req.text_tokens, req.n_frames
                self.release(rid)
                sink.finished(rid, reason, n_in, n_out)

    def _decode_chunks(self, due: list[_Request], **lane: int) -> list[torch.Tensor]:
        """Decode the buffered frames of the due requests in one batched codec call; returns each one's new PCM.

        A request's first call primes the decoder with its reference frames (if any) as left context;
        their audio is dropped here."""
        assert self.codec is not None
        codes_list, states, drop = [], [], []
        for req in due:
            codes = torch.stack(req.buffer, dim=1)  # [G, t]
            skip = 0
            if req.codec_state is None:
                req.codec_state = self.codec.new_stream_state()
                if req.spec.ref_codes is not None:
                    ref = req.spec.ref_codes.t().to(codes.device)
                    codes = torch.cat([ref, codes], dim=1)
                    skip = ref.shape[1] * self.codec.samples_per_frame
            codes_list.append(codes)
            states.append(req.codec_state)
            drop.append(skip)
        outs = self.codec.decode_stream(codes_list, states, **lane)
        return [pcm[skip:] for pcm, skip in zip(outs, drop, strict=True)]

    def _decode_async(self, due: list[_Request], stream: torch.cuda.Stream | None, **lane: int) -> None:
        """Decode the due chunks on `stream` (None: the current one); their PCM reaches pinned memory
        asynchronously."""
        assert self.codec is not None
        ds = stream or torch.cuda.current_stream()
        ds.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(ds):
            span = self._gpu_span(f"decoder_lane{lane.get('lane', 1)}", ds)
            pieces = self._decode_chunks(due, **lane)
            span()
            flat = torch.cat(pieces).float() if pieces else torch.zeros(0, device=ds.device)
            host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record(ds)
        spans, off = [], 0
        for req, piece in zip(due, pieces, strict=True):
            n = piece.shape[0]
            spans.append((req, off, n))
            off += n
            req.inflight += 1
        self._inflight.append((event, host, spans))

    def _poll(self, sink: OutputSink, block: bool) -> None:
        """Send the audio of every finished decoder call, oldest first (`block`: if none has finished,
        wait a little for one; never long, so the engine keeps admitting new requests while a long
        decoder call runs). Calls finish out of order only across streams: a first chunk on the AR stream
        may overtake older calls on the decoder stream. A call waits while an older one of the same request
        does, so each request's audio goes out in order."""
        if block and self._inflight:
            deadline = time.perf_counter() + BLOCK_MAX_S
            while not any(e.query() for e, _, _ in self._inflight) and time.perf_counter() < deadline:
                time.sleep(POLL_INTERVAL_S)
        waiting, held = [], set()  # held: requests with an older call still running
        for event, host, spans in self._inflight:
            if not event.query() or any(req.rid in held for req, _, _ in spans):
                waiting.append((event, host, spans))
                held.update(req.rid for req, _, _ in spans)
                continue
            pcm = host.numpy()
            for req, off, n in spans:
                req.inflight -= 1
                if n and self.requests.get(req.rid) is req:
                    self._send_audio(sink, req, pcm[off : off + n].copy())
        self._inflight = waiting

    def _gpu_span(self, name: str, stream: torch.cuda.Stream | None) -> Callable[[], None]:
        """With timing on CUDA: time the device work queued on `stream` from now until the returned function
        is called; otherwise a no-op."""
        if self._timing is None or stream is None:
            return lambda: None
        return self._timing.gpu_span(name, stream)

    def _send_audio(self, sink: OutputSink, req: _Request, pcm: np.ndarray) -> None:
        if not req.audio_sent and self._timing is not None:
            self._timing.latency["first_audio"].append(time.perf_counter() - req.created)
        req.audio_sent = True
        sink.audio(req.rid, pcm)


def load_runner(model_path: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype = torch.float32,
                **kwargs: Any) -> Qwen3TTSRunner:
    """Build a runner from a checkpoint directory or HF repo id, with the speech tokenizer's
    streaming decoder (and reference encoder, for in-context cloning) when they are available."""
    model = Qwen3TTSModel.from_pretrained(model_path, device=device, dtype=dtype)
    assert model.model_dir is not None
    st_dir = model.model_dir / "speech_tokenizer"
    codec = kwargs.pop("codec", None) or _load_codec(st_dir, device, os.environ.get("STREAMVOX_QWEN3_CODEC_DTYPE",
                                                                                      "auto"))
    ref_enc = kwargs.pop("reference_encoder", None) or _load_reference_encoder(st_dir, device)
    # A repo id names the model better than its snapshot directory (a commit hash).
    given = Path(model_path)
    name = kwargs.pop("name", None) or (given.name if given.is_dir() else str(model_path))
    return Qwen3TTSRunner(model, codec, reference_encoder=ref_enc, name=name, **kwargs)


# The codec decoder's dtype ("auto": see _load_codec) and, for "auto" on CUDA, how closely float16 must decode
# as float32 on the served checkpoint. On the H200 (random 1.7B-shape weights, gpu_bench.py --micro): TF32
# convolutions 60 dB against strict float32, float16 54 dB, bfloat16 36 dB; float16 served 64 streams
# 11% faster than float32.
FLOAT16_MIN_DB = 45.0


def _load_codec(st_dir: Path, device: str, dtype: str) -> StreamingCodec | None:
    """The speech tokenizer's decoder in `dtype` (a torch dtype's name, or "auto": float32, and on CUDA
    float16 instead when it decodes as float32 does to FLOAT16_MIN_DB on this checkpoint's weights)."""
    if not (st_dir / "config.json").exists():
        return None
    if dtype != "auto":
        return Code2Wav.from_pretrained(st_dir, device=device, dtype=getattr(torch, dtype))
    codec = Code2Wav.from_pretrained(st_dir, device=device, dtype=torch.float32)
    if torch.device(device).type != "cuda":
        return codec
    half = Code2Wav.from_pretrained(st_dir, device=device, dtype=torch.float16)
    db = agreement_db(codec, half)
    if db < FLOAT16_MIN_DB:
        log.warning("codec decoder: float16 decodes %.1f dB from float32 (< %.0f dB): float32", db, FLOAT16_MIN_DB)
        return codec
    log.info("codec decoder: float16 (%.1f dB from float32)", db)
    return half


def _load_reference_encoder(st_dir: Path, device: str) -> ReferenceEncoder | None:
    """Reference codes for in-context cloning from the speech tokenizer's encoder (the codec side's
    `codec_encoder` module): its `encode_reference(codes_model, pcm, sr) -> LongTensor[T, 16]` when it
    offers one, else `CodecEncoder.from_pretrained(dir).encode(pcm_at_its_rate)`."""
    if not (st_dir / "config.json").exists():
        return None
    try:
        from streamvox.models.qwen3_tts.codec import encoder as codec_encoder
    except ImportError:
        return None
    enc_cls = getattr(codec_encoder, "CodecEncoder", None)
    if enc_cls is None:
        return None
    enc = enc_cls.from_pretrained(st_dir, device=device)
    custom = getattr(codec_encoder, "encode_reference", None)
    if custom is not None:
        return lambda pcm, sr: custom(enc, pcm, sr)
    rate = int(getattr(enc, "sample_rate", 24000))

    def encode(pcm: np.ndarray, sr: int) -> torch.Tensor:
        with torch.inference_mode():
            return enc.encode(torch.from_numpy(resample(pcm, sr, rate))).cpu()

    return encode

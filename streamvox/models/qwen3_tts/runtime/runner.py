"""The Qwen3-TTS-12Hz `Runner`: continuous batching over a preallocated KV cache, for CustomVoice, VoiceDesign
and Base checkpoints.

The runner wires the parts together and answers the engine core (`streamvox.contract.Runner`, and
`VoiceCloningRunner` for Base checkpoints):

- `requests.Admission` validates a `SpeechRequest` into a `requests.Request`, which holds everything the
  request owns; `voices.VoiceCloning` derives cloned voices from reference audio;
- `scheduler.Scheduler` decides what each engine step runs: prefills into free slots of the talker's
  `kv_cache.SlotCache`, then one frame step for every request whose next text token is known, on the
  `eager.EagerPath` or, on CUDA, the `fast_steps.FastSteps` over the CUDA-graph
  `fast_path.FrameStepper`;
- `decode_pipeline.DecodePipeline` turns buffered frames into audio deltas on the sink, in chunks;
- `timing.StepTiming` (with `Qwen3Settings.timing`) logs where each step's time goes.

On CUDA the AR work (prefill, frame steps) and first chunks run on the highest-priority stream, the other
decoder calls on a lower one, so a busy decoder delays a new request's first audio as little as possible
(`kernels/graphs.py` ranks the streams, a GPU word aligner's last).
`loader.load_runner` builds a runner from a checkpoint. The knobs are `streamvox.settings.Qwen3Settings`.
"""

from __future__ import annotations

import contextlib
import time

import torch

from streamvox.contract import ModelInfo, OutputSink, RequestError, SpeechRequest
from streamvox.models.qwen3_tts.kernels.graphs import AR_PRIORITY, DECODER_PRIORITY
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.model.prompt import PromptBuilder
from streamvox.models.qwen3_tts.openai_voices import served_voices
from streamvox.models.qwen3_tts.runtime.decode_pipeline import DecodePipeline, StreamingCodec
from streamvox.models.qwen3_tts.runtime.eager import EagerPath
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper, width_bucket
from streamvox.models.qwen3_tts.runtime.fast_steps import FastSteps
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache
from streamvox.models.qwen3_tts.runtime.requests import Admission, FrameHook, Request
from streamvox.models.qwen3_tts.runtime.scheduler import Scheduler
from streamvox.models.qwen3_tts.runtime.timing import StepTiming
from streamvox.models.qwen3_tts.runtime.voices import ReferenceEncoder, VoiceCloning
from streamvox.models.qwen3_tts.sampling import MIN_NEW_TOKENS, suppressed_codebook0_ids
from streamvox.settings import Qwen3Settings


class Qwen3TTSRunner:
    """`Runner` for a Qwen3-TTS-12Hz checkpoint (CustomVoice, VoiceDesign or Base).

    `codec`: the streaming codec decoder (None: frames only, no audio); `reference_encoder`: reference codes
    for in-context cloning; `on_frame`: sees every generated frame (tests, benchmarks); `max_prefill_tokens`:
    padded positions per batched prefill on the fast path; `settings`: the runtime knobs (default: their
    defaults, not the environment)."""

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
        on_frame: FrameHook | None = None,
        name: str | None = None,
        max_prefill_tokens: int = 16384,
        settings: Qwen3Settings | None = None,
    ) -> None:
        settings = settings or Qwen3Settings()
        self.model = model
        self.timing = StepTiming(settings.timing_steps) if settings.timing else None
        cfg = model.cfg
        self.task = cfg.tts_model_type or "custom_voice"
        tc = cfg.talker
        assert tc.code_predictor is not None
        # one slot more than requests: the fast path's scratch slot (padded rows of a batched prefill)
        self.cache = SlotCache(tc.num_hidden_layers, max_batch + 1, tc.num_key_value_heads, max_seq_len,
                               tc.head_dim, model.dtype, model.device)
        self.requests: dict[str, Request] = {}
        suppress = suppressed_codebook0_ids(tc.vocab_size, tc.codec_eos_token_id, settings.ignore_eos, model.device)
        use_fast = settings.fast == "1" or (settings.fast == "auto" and model.device.type == "cuda")
        self.stepper = (FrameStepper(model, self.cache, suppress, tc.codec_eos_token_id, MIN_NEW_TOKENS,
                                     settings=settings) if use_fast else None)
        cuda = model.device.type == "cuda"
        self.ar_stream = torch.cuda.Stream(model.device, priority=AR_PRIORITY) if cuda else None
        dec_stream = torch.cuda.Stream(model.device, priority=DECODER_PRIORITY) if cuda else None
        self.pipeline = DecodePipeline(codec, self.requests, codec_chunk_frames, max_batch, settings.codec_graphs,
                                       dec_stream, self.timing)
        if self.stepper is not None and self.stepper.use_graphs:
            warm = settings.warmup_widths
            widths = tuple(width_bucket(int(w), max_seq_len) for w in warm.split(",") if w.strip())
            self.stepper.warmup(max_batch, widths)
        if self.timing is not None and cuda:
            torch.cuda.set_sync_debug_mode("warn")  # name every host sync in the engine (one warning per line)
        sr = self.codec.sample_rate if self.codec is not None else 24000
        speakers = sorted(cfg.speakers)
        self.info = ModelInfo(
            name=name or (model.model_dir.name if model.model_dir else "qwen3-tts"),
            family="qwen3_tts",
            sample_rate=sr,
            voices=served_voices(self.task, speakers),  # with OpenAI's voice names (qwen3_tts/openai_voices.py)
            default_voice=speakers[0] if (self.task == "custom_voice" and speakers) else "default",
            languages=cfg.languages,
            task_types=[self.task],
            speaker_embedding_size=cfg.speaker_encoder.enc_dim if self.task == "base" else 0,
            streaming_text=True,
            native_speed=False,
            voice_cloning=self.task == "base",
        )
        self.cloning = VoiceCloning(model, reference_encoder, max_ref_audio_seconds)
        self.admission = Admission(model, self.task, self.info.default_voice, max_instruction_tokens, self.cloning)
        fast = None
        if self.stepper is not None:
            fast = FastSteps(self.stepper, model, self.requests, self.pipeline, max_batch, settings.batch_prefill,
                             settings.ignore_eos, self.ar_stream, dec_stream, self.timing, on_frame)
        self.scheduler = Scheduler(self.requests, PromptBuilder(model), self.cache,
                                   EagerPath(model, self.cache, suppress, on_frame), fast, self.pipeline, max_batch,
                                   max_batch if settings.batch_prefill else 1, max_prefill_tokens, self.timing)

    @property
    def codec(self) -> StreamingCodec | None:
        """The codec decoder as served (a `GraphedDecoder` around a `Code2Wav` on CUDA)."""
        return self.pipeline.codec

    @property
    def free_slots(self) -> list[int]:
        return self.scheduler.free_slots

    def _on_ar_stream(self) -> contextlib.AbstractContextManager:
        """Device work of the engine thread runs on the AR stream (CUDA), so it needs no cross-stream syncs."""
        return torch.cuda.stream(self.ar_stream) if self.ar_stream is not None else contextlib.nullcontext()

    def add(self, request: SpeechRequest) -> None:
        t0 = time.perf_counter()
        with self._on_ar_stream():
            if request.request_id in self.requests:
                raise RequestError(f"request id {request.request_id!r} is already active", param="request_id")
            self.scheduler.add(self.admission.new_request(request))
        if self.timing is not None:
            self.timing.add("add_request", time.perf_counter() - t0, 1)

    def feed_text(self, request_id: str, text: str) -> None:
        req = self.requests.get(request_id)
        if req is not None:
            req.feed(text)

    def end_input(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is not None:
            req.end_text()

    def release(self, request_id: str) -> None:
        self.scheduler.release(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @torch.inference_mode()
    def step(self, sink: OutputSink) -> None:
        with self._on_ar_stream():
            self.scheduler.step(sink)

    @torch.inference_mode()
    def add_voice(self, name: str, ref_audio: bytes, sample_rate: int, ref_text: str | None = None) -> None:
        """Register a cloned voice (Base checkpoints): its embedding and reference codes are computed
        once here, and a request whose `voice` is `name` uses them. Replaces a voice of that name."""
        if self.task != "base":
            raise RequestError(f"model does not support voice cloning (a {self.task!r} checkpoint)",
                               param="audio", code="voice_cloning_unsupported")
        with self._on_ar_stream():
            self.cloning.voices[name] = self.cloning.analyse(ref_audio, sample_rate, ref_text)

    def remove_voice(self, name: str) -> None:
        """Forget a cloned voice; requests already admitted with it keep their copy."""
        self.cloning.voices.pop(name, None)

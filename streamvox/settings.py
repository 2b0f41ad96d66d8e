"""Every knob of StreamVox, read once and documented once.

Command-line flags fill `ServerSettings` (see `streamvox.cli`). Knobs that are
not flags are environment variables, read here and nowhere else: `from_env()`
of each group reads its variables once, when the process that uses them
starts (the server for `ServerEnv`, the engine core for `Qwen3Settings`).
Each field's comment is its documentation; README's tables point here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields


def _from_env(cls, env: Mapping[str, str], prefix: str):
    """An instance of dataclass `cls` whose fields come from `<prefix><FIELD NAME>` variables where set."""
    values = {}
    for f in fields(cls):
        raw = env.get(prefix + f.name.upper())
        if raw is None:
            continue
        default = f.default if f.default is not MISSING else None
        kind = type(default)
        try:
            if kind is bool:
                if raw not in ("0", "1"):
                    raise ValueError("0 or 1")
                values[f.name] = raw == "1"
            elif kind in (int, float):
                values[f.name] = kind(raw)
            else:
                values[f.name] = raw
        except ValueError as error:
            raise ValueError(f"{prefix}{f.name.upper()}={raw!r}: expected {error}") from None
    return cls(**values)


@dataclass(frozen=True)
class MediaPolicy:
    """Where a request's `ref_audio` may be read from besides inline base64 (docs/LIMITS.md)."""

    allow_urls: bool = False  # --allow-ref-audio-urls: http(s) URLs
    allow_private_urls: bool = False  # --allow-private-ref-audio-urls: URLs that resolve to private addresses
    local_media_path: str | None = None  # --allowed-local-media-path: file:// URLs under this directory
    fetch_timeout_s: float = 10.0  # --ref-audio-fetch-timeout-s


@dataclass(frozen=True)
class AgentSettings:
    """The voice agent's stages (docs/voice-agent.md): a thinker LLM and a speech recogniser."""

    llm: str | None = None  # --llm: a chat model run on vLLM inside the server
    llm_url: str | None = None  # --llm-url: an OpenAI-compatible endpoint instead
    llm_model: str | None = None  # --llm-model: the model name sent to --llm-url
    llm_api_key: str | None = None  # --llm-api-key
    asr: str | None = None  # --asr: a Whisper model run on vLLM
    max_tokens: int = 256  # --llm-max-tokens: longest reply
    context_tokens: int = 2048  # --llm-context-tokens: history kept for the thinker
    temperature: float = 0.7  # --llm-temperature
    seed: int | None = None  # --llm-seed

    @property
    def enabled(self) -> bool:
        return bool(self.llm or self.llm_url or self.asr)


@dataclass(frozen=True)
class ServerEnv:
    """Server-process knobs from `STREAMVOX_*` variables."""

    realtime_idle_timeout_s: float = 1800.0  # STREAMVOX_REALTIME_IDLE_TIMEOUT_S: close an idle /v1/realtime
    speech_stream_idle_timeout_s: float = 300.0  # STREAMVOX_SPEECH_STREAM_IDLE_TIMEOUT_S: same, speech stream
    cartesia_idle_timeout_s: float = 300.0  # STREAMVOX_CARTESIA_IDLE_TIMEOUT_S: same, /tts/websocket
    malloc_trim: bool = True  # STREAMVOX_MALLOC_TRIM=0: don't hand freed heap back to the OS when idle

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ServerEnv:
        return _from_env(cls, env, "STREAMVOX_")


@dataclass(frozen=True)
class ServerSettings:
    """What `streamvox serve` was asked for."""

    model: str = "espeak"  # --model
    model_options: dict = field(default_factory=dict)  # --device, --dtype, --max-batch (`load_runner`)
    api_key: str | None = None  # --api-key: required on every route but the /demo page
    exit_on_engine_crash: bool = False  # --exit-on-engine-crash: exit 3 for a supervisor instead of restarting
    agent: AgentSettings = field(default_factory=AgentSettings)
    max_buffered_audio_s: float = 300.0  # --max-buffered-audio-s: cancel a request whose client stops reading
    engine_restart_backoff_max_s: float = 30.0  # --engine-restart-backoff-max-s
    media: MediaPolicy = field(default_factory=MediaPolicy)
    allowed_origins: tuple[str, ...] = ()  # --allowed-origins: WebSocket origins besides none and same-host
    voices_dir: str | None = None  # --voices-dir: cloned voices; None: the user's data directory
    replica: str | None = None  # set by streamvox.scale: this server's Ray Serve replica, named by /health
    env: ServerEnv = field(default_factory=ServerEnv.from_env)


@dataclass(frozen=True)
class EngineEnv:
    """Engine-core knobs from `STREAMVOX_*` variables."""

    fault_engine_start_file: str = ""  # STREAMVOX_FAULT_ENGINE_START_FILE: tests: fail at start while it exists

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> EngineEnv:
        return _from_env(cls, env, "STREAMVOX_")


@dataclass(frozen=True)
class Qwen3Settings:
    """Qwen3-TTS runtime knobs from `STREAMVOX_QWEN3_*` variables ("auto": decided by the device).

    These exist for GPU measurements and for machines the defaults do not suit; docs/gpu.md says what
    each one was measured to do.
    """

    fast: str = "auto"  # FAST: the CUDA-graph frame step (0 off, 1 on; auto: on CUDA)
    cuda_graphs: bool = True  # CUDA_GRAPHS=0: the fast path without CUDA graphs
    compile: str = "auto"  # COMPILE: torch.compile of the fused layer halves (auto: on CUDA)
    kernels: str = "auto"  # KERNELS: the Triton decode-layer kernels (auto: on CUDA with triton)
    kernel_max_rows: int = 256  # KERNEL_MAX_ROWS: the largest frame step on the Triton kernels
    split_attend_max_rows: int = 16  # SPLIT_ATTEND_MAX_ROWS: frame steps that attend in one launch
    predictor_kernel: str = "auto"  # PREDICTOR_KERNEL: the one-launch predictor (0 never, 1 required)
    talker_kernel: str = "auto"  # TALKER_KERNEL: the one-launch talker (0 never, 1 required)
    decoder_sms: str = "0"  # DECODER_SMS: multiprocessors the one-launch kernels leave to the codec decoder
    warmup_widths: str = "256,512"  # WARMUP_WIDTHS: attention widths whose graphs are captured at load
    batch_prefill: bool = True  # BATCH_PREFILL=0: fast-path prompts one at a time
    codec_dtype: str = "auto"  # CODEC_DTYPE: float32, float16, bfloat16; auto: float16 if it agrees to 45 dB
    codec_compile: bool = True  # CODEC_COMPILE=0: no fused SnakeBeta in the codec decoder on CUDA
    codec_graphs: str = "auto"  # CODEC_GRAPHS: the slot decoder (1 on, also on the CPU; 0 off; auto: CUDA)
    ignore_eos: bool = False  # IGNORE_EOS=1: never choose end-of-speech (fixed-length benchmark output)
    aligner_graphs: str = "auto"  # ALIGNER_GRAPHS: the word aligner's graphs (1: also on the CPU, uncaptured)
    aligner_fused: str = "auto"  # ALIGNER_FUSED: the word aligner's text layers fused (1: also on the CPU, uncompiled)
    timing: bool = False  # TIMING=1: log where each engine step's time goes (runtime/timing.py)
    timing_steps: int = 250  # TIMING_STEPS: engine steps per timing report

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Qwen3Settings:
        return _from_env(cls, env, "STREAMVOX_QWEN3_")

"""Speech recognition of committed input audio turns.

`Transcriber.stream(pcm, sample_rate, request_id)` yields transcript deltas. `VLLMWhisper` runs a Whisper-family
checkpoint (`streamvox serve --asr DIR_OR_REPO`) with vLLM's `AsyncLLM` (encoder-decoder; its engine core runs in
a process of its own). Audio is resampled to 16 kHz and cut into windows of at most 30 s, Whisper's input size,
transcribed one after another.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import aclosing

import numpy as np

from streamvox.agent.errors import StageError
from streamvox.agent.vllm_engine import VLLMEngine, VLLMStage
from streamvox.audio.resample import Resampler

WHISPER_RATE = 16000
WINDOW_S = 30


class Transcriber:
    name = "asr"
    model = ""

    async def start(self) -> None:
        pass

    def stream(self, pcm: np.ndarray, sample_rate: int, request_id: str,
               language: str | None = None, prompt: str | None = None) -> AsyncIterator[str]:
        raise NotImplementedError

    @property
    def active_requests(self) -> int:
        return 0

    async def shutdown(self) -> None:
        pass


def to_whisper_rate(pcm: np.ndarray, sample_rate: int) -> np.ndarray:
    if sample_rate == WHISPER_RATE:
        return pcm.astype(np.float32)
    resampler = Resampler(sample_rate, WHISPER_RATE)
    return np.concatenate([resampler.process(pcm.astype(np.float32)), resampler.flush()])


class VLLMWhisper(VLLMStage, Transcriber):
    name = "vllm-whisper"

    def __init__(self, model: str, *, max_tokens: int = 128, dtype: str = "auto", enforce_eager: bool = True) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.engine: VLLMEngine | None = None

    async def start(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise StageError(f"--asr needs vLLM: pip install -e '.[llm]' ({exc})", "vllm_missing") from exc
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        args = AsyncEngineArgs(model=self.model, dtype=self.dtype, enforce_eager=self.enforce_eager,
                               max_num_seqs=4, disable_log_stats=True, limit_mm_per_prompt={"audio": 1})
        self.engine = VLLMEngine(await asyncio.to_thread(AsyncLLM.from_engine_args, args))

    async def stream(self, pcm: np.ndarray, sample_rate: int, request_id: str,
                     language: str | None = None, prompt: str | None = None) -> AsyncIterator[str]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        audio = await asyncio.to_thread(to_whisper_rate, pcm, sample_rate)
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, output_kind=RequestOutputKind.DELTA)
        decoder = f"<|startoftranscript|><|{language or 'en'}|><|transcribe|><|notimestamps|>"
        window = WINDOW_S * WHISPER_RATE
        for index, start in enumerate(range(0, max(len(audio), 1), window)):
            piece = audio[start:start + window]
            if len(piece) < WHISPER_RATE // 10:  # under 100 ms: nothing to hear
                continue
            inputs = {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (piece, WHISPER_RATE)}},
                      "decoder_prompt": decoder}
            async with aclosing(self.engine.deltas(inputs, params, f"{request_id}-{index}")) as deltas:
                async for text in deltas:
                    yield text

"""Pipecat's `CartesiaTTSService(url=...)` against a StreamVox server, in a pipeline fed as an LLM feeds it. Run by
test_cartesia_plugins.py with the clients venv's python (scripts/setup_clients_venv.sh), not collected by pytest.

usage: pipecat_cartesia_client.py WS_URL API_KEY VOICE TEXT CASE...
CASE: sentence (the default text aggregation: whole sentences, `max_buffer_delay_ms: 0`), token (each LLM token
as it comes), interrupt (a long turn interrupted after its first audio, then another turn on the same socket),
http (`CartesiaHttpTTSService`: `POST /tts/bytes` per sentence).
Prints one JSON object: for each case the audio the pipeline carried (sample rates, samples) and the words the
service timed, or the error; `interrupt` also counts the audio frames that came after the interruption.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.cartesia.tts import CartesiaHttpTTSService, CartesiaTTSService
from pipecat.services.tts_service import TextAggregationMode
from pipecat.workers.runner import WorkerRunner

PACE_S = 0.05  # 20 tokens a second


class Collector(FrameProcessor):
    """Keeps what reaches it: audio, timed words, errors, and each turn's end (`TTSStoppedFrame`)."""

    def __init__(self) -> None:
        super().__init__()
        self.audio: list[tuple[float, TTSAudioRawFrame]] = []
        self.words: list[str] = []
        self.errors: list[str] = []
        self.stopped = 0
        self.changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio.append((time.monotonic(), frame))
        elif isinstance(frame, TTSTextFrame):
            self.words.append(frame.text)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        elif isinstance(frame, TTSStoppedFrame):
            self.stopped += 1
        self.changed.set()
        await self.push_frame(frame, direction)

    async def wait(self, condition, timeout: float = 300) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def _summary(frames: list[TTSAudioRawFrame], words: list[str], errors: list[str], **extra) -> dict:
    return {"sample_rates": sorted({f.sample_rate for f in frames}),
            "channels": sorted({f.num_channels for f in frames}),
            "samples": sum(len(f.audio) // (2 * f.num_channels) for f in frames),
            "words": words, "errors": errors, **extra}


async def _llm_turn(worker: PipelineWorker, text: str) -> None:
    """What an LLM service pushes: a response start, its tokens at LLM pace, a response end."""
    await worker.queue_frame(LLMFullResponseStartFrame())
    words = text.split(" ")
    for i, word in enumerate(words):
        await worker.queue_frame(LLMTextFrame(("" if i == 0 else " ") + word))
        await asyncio.sleep(PACE_S)
    await worker.queue_frame(LLMFullResponseEndFrame())


async def run_case(url: str, api_key: str, voice: str, text: str, case: str) -> dict:
    mode = TextAggregationMode.TOKEN if case == "token" else TextAggregationMode.SENTENCE
    if case == "http":
        base_url = url.replace("ws", "http", 1).removesuffix("/tts/websocket")
        service = CartesiaHttpTTSService(api_key=api_key, base_url=base_url, sample_rate=24000,
                                         settings=CartesiaHttpTTSService.Settings(voice=voice, model="sonic-3"))
    else:
        service = CartesiaTTSService(api_key=api_key, url=url, sample_rate=24000, text_aggregation_mode=mode,
                                     settings=CartesiaTTSService.Settings(voice=voice, model="sonic-3"))
    upstream, collector = Collector(), Collector()  # errors travel upstream, audio downstream
    worker = PipelineWorker(Pipeline([upstream, service, collector]), params=PipelineParams(),
                            idle_timeout_secs=None)
    running = asyncio.create_task(WorkerRunner(handle_sigint=False).run(worker))
    try:
        if case != "interrupt":
            await _llm_turn(worker, text)
            await collector.wait(lambda: collector.stopped or collector.errors or upstream.errors)
            return _summary([f for _, f in collector.audio], collector.words, upstream.errors + collector.errors)
        pushing = asyncio.create_task(_llm_turn(worker, " ".join([text] * 6)))
        await collector.wait(lambda: collector.audio)
        pushing.cancel()
        interrupted_at = time.monotonic()
        await worker.queue_frame(InterruptionFrame())
        await asyncio.sleep(1.5)  # anything still coming for the interrupted turn comes now
        late = sum(1 for t, _ in collector.audio if t > interrupted_at)
        first = len(collector.audio)
        stopped = collector.stopped
        await _llm_turn(worker, text)
        await collector.wait(lambda: collector.stopped > stopped or collector.errors or upstream.errors)
        return _summary([f for _, f in collector.audio[first:]], collector.words, upstream.errors + collector.errors,
                        frames_after_interruption=late, interrupted_turn_samples=sum(
                            len(f.audio) // 2 for _, f in collector.audio[:first]))
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(running, 30)
        finally:
            if not running.done():
                await worker.cancel()


async def main(url: str, api_key: str, voice: str, text: str, cases: list[str]) -> dict:
    results = {}
    for case in cases:
        try:
            results[case] = await asyncio.wait_for(run_case(url, api_key, voice, text, case), 600)
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}".strip()}
    return results


if __name__ == "__main__":
    ws_url, key, voice_name, speech = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(ws_url, key, voice_name, speech, sys.argv[5:]))))

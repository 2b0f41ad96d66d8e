"""Pipecat at its defaults against a StreamVox server. Run by test_frameworks.py with the clients venv's python
(scripts/setup_clients_venv.sh), not collected by pytest.

usage: pipecat_client.py BASE_URL API_KEY TEXT CASE...
CASE: tts (`OpenAITTSService` at its defaults, in a pipeline), realtime (`OpenAIRealtimeLLMService` at its
defaults, answering a user message: the server has no thinker, so it speaks that message).
Prints one JSON object: for each case the audio the pipeline carried (sample rates, channel counts, samples per
channel), or the error.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.workers.runner import WorkerRunner


class Collector(FrameProcessor):
    """Keeps the audio frames that reach it and notes when the service's turn ends or fails."""

    def __init__(self, end: type[Frame]) -> None:
        super().__init__()
        self.end = end
        self.audio: list[TTSAudioRawFrame] = []
        self.errors: list[str] = []
        self.done = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio.append(frame)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
            self.done.set()
        elif isinstance(frame, self.end):
            self.done.set()
        await self.push_frame(frame, direction)


async def run_pipeline(service: FrameProcessor, first: Frame, end: type[Frame]) -> dict:
    upstream, collector = Collector(end), Collector(end)  # errors travel upstream, audio downstream
    worker = PipelineWorker(Pipeline([upstream, service, collector]), params=PipelineParams(),
                            idle_timeout_secs=None)
    runner = WorkerRunner(handle_sigint=False)
    running = asyncio.create_task(runner.run(worker))
    try:
        await worker.queue_frame(first)
        waits = [asyncio.ensure_future(c.done.wait()) for c in (upstream, collector)]
        await asyncio.wait([*waits, running], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 30)
    finally:
        if not running.done():
            await worker.cancel()
    frames = collector.audio
    return {"sample_rates": sorted({f.sample_rate for f in frames}),
            "channels": sorted({f.num_channels for f in frames}),
            "samples": sum(len(f.audio) // (2 * f.num_channels) for f in frames),
            "errors": upstream.errors + collector.errors}


async def main(base_url: str, api_key: str, text: str, cases: list[str]) -> dict:
    ws_url = base_url.replace("http", "ws", 1)
    runs = {
        "tts": lambda: run_pipeline(OpenAITTSService(api_key=api_key, base_url=base_url), TTSSpeakFrame(text),
                                    TTSStoppedFrame),
        "realtime": lambda: run_pipeline(
            OpenAIRealtimeLLMService(api_key=api_key, base_url=f"{ws_url}/realtime"),
            LLMContextFrame(LLMContext(messages=[{"role": "user", "content": text}])), LLMFullResponseEndFrame),
    }
    results = {}
    for case in cases:
        try:
            results[case] = await asyncio.wait_for(runs[case](), 120)
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}".strip()}
    return results


if __name__ == "__main__":
    url, key, speech = sys.argv[1:4]
    print(json.dumps(asyncio.run(main(url, key, speech, sys.argv[4:]))))

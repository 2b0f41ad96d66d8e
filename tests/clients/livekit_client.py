"""LiveKit Agents at its defaults against a StreamVox server. Run by test_frameworks.py with the clients venv's
python (scripts/setup_clients_venv.sh), not collected by pytest.

usage: livekit_client.py BASE_URL API_KEY TEXT CASE...
CASE: tts-1 | gpt-4o-mini-tts (`openai.TTS` at its defaults but the model), stream-adapter (`tts.StreamAdapter`
around the default `openai.TTS`), realtime (`openai.realtime.RealtimeModel` at its defaults: voice marin).
Prints one JSON object: for each case the decoded audio (sample rates, channel counts, samples per channel) and
the request id the client saw, or the error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback

import aiohttp
from livekit import rtc
from livekit.agents import tts
from livekit.plugins import openai


class Warnings(logging.Handler):
    """LiveKit's warnings (e.g. "no request_id provided for TTS" when a response lacks x-request-id)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _audio(frames: list[rtc.AudioFrame], **extra) -> dict:
    return {"sample_rates": sorted({f.sample_rate for f in frames}),
            "channels": sorted({f.num_channels for f in frames}),
            "samples": sum(f.samples_per_channel for f in frames), **extra}


async def synthesize(base_url: str, api_key: str, text: str, model: str) -> dict:
    engine = openai.TTS(base_url=base_url, api_key=api_key, model=model)
    frames, request_ids = [], set()
    try:
        async for audio in engine.synthesize(text):
            frames.append(audio.frame)
            request_ids.add(audio.request_id)
    finally:
        await engine.aclose()
    return _audio(frames, request_ids=sorted(request_ids))


async def stream_adapter(base_url: str, api_key: str, text: str) -> dict:
    engine = tts.StreamAdapter(tts=openai.TTS(base_url=base_url, api_key=api_key))
    frames = []
    try:
        stream = engine.stream()
        for word in text.split(" "):  # as an LLM's tokens arrive
            stream.push_text(word + " ")
        stream.end_input()
        async for audio in stream:
            frames.append(audio.frame)
        await stream.aclose()
    finally:
        await engine.aclose()
    return _audio(frames)


async def realtime(base_url: str, api_key: str, text: str) -> dict:
    async with aiohttp.ClientSession() as http:
        model = openai.realtime.RealtimeModel(base_url=base_url, api_key=api_key, http_session=http)
        session = model.session()
        errors = []
        session.on("error", lambda event: errors.append(str(getattr(event, "error", event))))
        frames = []
        try:
            # The server has no thinker: it speaks the response's instructions.
            generation = await asyncio.wait_for(session.generate_reply(instructions=text), 30)
            async for message in generation.message_stream:
                async for frame in message.audio_stream:
                    frames.append(frame)
        finally:
            await session.aclose()
            await model.aclose()
        return _audio(frames, voice=model._opts.voice, errors=errors)


async def main(base_url: str, api_key: str, text: str, cases: list[str]) -> dict:
    runs = {"tts-1": lambda: synthesize(base_url, api_key, text, "tts-1"),
            "gpt-4o-mini-tts": lambda: synthesize(base_url, api_key, text, "gpt-4o-mini-tts"),
            "stream-adapter": lambda: stream_adapter(base_url, api_key, text),
            "realtime": lambda: realtime(base_url, api_key, text)}
    warnings = Warnings()
    logging.getLogger("livekit").addHandler(warnings)
    results = {}
    for case in cases:
        warnings.messages = []
        try:
            results[case] = await asyncio.wait_for(runs[case](), 90)
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}".strip()}
        results[case]["warnings"] = warnings.messages
    return results


if __name__ == "__main__":
    url, key, speech = sys.argv[1:4]
    print(json.dumps(asyncio.run(main(url, key, speech, sys.argv[4:]))))

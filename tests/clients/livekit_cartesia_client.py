"""LiveKit Agents' Cartesia plugin (`cartesia.TTS(base_url=...)`) against a StreamVox server. Run by
test_cartesia_plugins.py with the clients venv's python (scripts/setup_clients_venv.sh), not collected by pytest.

usage: livekit_cartesia_client.py BASE_URL API_KEY VOICE TEXT TIMEOUT_S CASE...
CASE: stream (text pushed word by word at LLM pace, then a second utterance on the reused socket), synthesize
(`POST /tts/bytes`), stream-16k (`sample_rate=16000`), bad-voice (an unknown voice, no retries). TIMEOUT_S: how long
the plugin waits for each message (its default is 10 s; a slow model on a busy CPU needs longer).
Prints one JSON object: for each case its audio (sample rates, samples), word timings, when the first audio and
the end of input came, or the error and how long it took to come.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback

import aiohttp
from livekit import rtc
from livekit.agents import APIConnectOptions, APIError
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.plugins import cartesia

PACE_S = 0.05  # 20 tokens a second, as an LLM streams them


def _audio(frames: list[rtc.AudioFrame], **extra) -> dict:
    words = [[str(w), w.start_time, w.end_time] for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    return {"sample_rates": sorted({f.sample_rate for f in frames}),
            "channels": sorted({f.num_channels for f in frames}),
            "samples": sum(f.samples_per_channel for f in frames), "words": words, **extra}


async def _utterance(engine: cartesia.TTS, text: str, timeout_s: float) -> dict:
    """Push `text` a word at a time while reading the audio."""
    stream = engine.stream(conn_options=APIConnectOptions(timeout=timeout_s))
    start = time.monotonic()
    input_ended = None

    async def push() -> None:
        nonlocal input_ended
        words = text.split(" ")
        for i, word in enumerate(words):
            stream.push_text(word + (" " if i < len(words) - 1 else ""))
            await asyncio.sleep(PACE_S)
        input_ended = time.monotonic() - start
        stream.end_input()

    pusher = asyncio.create_task(push())
    frames, first_audio = [], None
    async for audio in stream:
        if first_audio is None:
            first_audio = time.monotonic() - start
        frames.append(audio.frame)
    await pusher
    reused = stream._connection_reused
    await stream.aclose()
    return _audio(frames, first_audio_s=first_audio, input_ended_s=input_ended, connection_reused=reused)


async def stream_case(base_url: str, api_key: str, voice: str, text: str, timeout_s: float,
                      sample_rate: int = 24000) -> dict:
    async with aiohttp.ClientSession() as http:
        engine = cartesia.TTS(api_key=api_key, base_url=base_url, voice=voice, sample_rate=sample_rate,
                              http_session=http)
        try:
            first = await _utterance(engine, text, timeout_s)
            second = await _utterance(engine, text, timeout_s)
        finally:
            await engine.aclose()
    return {**first, "second": second}


async def synthesize_case(base_url: str, api_key: str, voice: str, text: str, timeout_s: float) -> dict:
    async with aiohttp.ClientSession() as http:
        engine = cartesia.TTS(api_key=api_key, base_url=base_url, voice=voice, http_session=http)
        try:
            options = APIConnectOptions(timeout=timeout_s)
            frames = [audio.frame async for audio in engine.synthesize(text, conn_options=options)]
        finally:
            await engine.aclose()
    return _audio(frames)


async def bad_voice_case(base_url: str, api_key: str, text: str) -> dict:
    async with aiohttp.ClientSession() as http:
        engine = cartesia.TTS(api_key=api_key, base_url=base_url, voice="no-such-voice", http_session=http)
        start = time.monotonic()
        try:
            stream = engine.stream(conn_options=APIConnectOptions(max_retry=0))
            stream.push_text(text)
            stream.end_input()
            async for _ in stream:
                pass
            return {"raised": None}
        except APIError as error:
            return {"raised": type(error).__name__, "message": str(error), "after_s": time.monotonic() - start}
        finally:
            await engine.aclose()


async def main(base_url: str, api_key: str, voice: str, text: str, timeout_s: float, cases: list[str]) -> dict:
    runs = {"stream": lambda: stream_case(base_url, api_key, voice, text, timeout_s),
            "stream-16k": lambda: stream_case(base_url, api_key, voice, text, timeout_s, 16000),
            "synthesize": lambda: synthesize_case(base_url, api_key, voice, text, timeout_s),
            "bad-voice": lambda: bad_voice_case(base_url, api_key, text)}
    results = {}
    for case in cases:
        try:
            results[case] = await asyncio.wait_for(runs[case](), 600)
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}".strip()}
    return results


if __name__ == "__main__":
    url, key, voice_name, speech, timeout = sys.argv[1:6]
    print(json.dumps(asyncio.run(main(url, key, voice_name, speech, float(timeout), sys.argv[6:]))))

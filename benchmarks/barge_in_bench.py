"""Barge-in latency on `/v1/realtime`: the user starts talking over a reply that is streaming.

Each round opens a session with server VAD, starts a long reply (`response.create` with instructions: the echo
responder speaks a long text, a thinker is asked for a long story) and, once its first audio delta is in, sends
the user's interruption as a microphone does: 20 ms of PCM16 every 20 ms (some silence, then espeak speech). The
latency is from sending the chunk where the speech begins (the first 10 ms frame above -45 dBFS) to receiving
`input_audio_buffer.speech_started`. That includes the audio the VAD needs to hear speech (Silero decides per
32 ms window, and a word's first sound may not be voiced yet): the same audio run through the VAD offline says
which chunk completes the detection, and the rest of the latency (from sending that chunk: the server's work and
both ways through the socket) is reported apart. Also reported: speech_started to `conversation.item.truncated`,
the reply cut at what can have been played (a reply still generated is cancelled first), and how many replies
had been generated to their end before the user spoke (they still play, and are cut all the same).

`--load N` runs N CPU-bound processes (`while True: pass`) beside the server for the loaded figures. Starts its own
`streamvox serve` (espeak) unless --url is given. Example:
  python benchmarks/barge_in_bench.py --rounds 50 --load 0 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import websockets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from streamvox.agent.vad import SileroVad, VadSettings  # noqa: E402
from tests.helpers.server import start_server  # noqa: E402

RATE = 24000
CHUNK_MS = 20
LEAD_SILENCE_S = 0.3
ECHO_REPLY = "This reply goes on for a long while, so that the user can talk over it at any moment. " * 60
THINKER_REPLY = "Tell the user a long story."
INTERRUPTION = "Wait, wait, please stop."


def speech(url: str, text: str) -> np.ndarray:
    response = httpx.post(f"{url}/v1/audio/speech", timeout=60,
                          json={"input": text, "response_format": "pcm", "sample_rate": RATE})
    response.raise_for_status()
    return np.frombuffer(response.content, "<i2")


def onset_ms(clip: np.ndarray) -> int:
    frames = clip[:len(clip) // 240 * 240].reshape(-1, 240).astype(np.float32) / 32768
    return int(np.flatnonzero(np.sqrt(np.mean(frames ** 2, axis=1)) > 10 ** (-45 / 20))[0]) * 10


async def one_round(ws_url: str, chunks: list[str], onset_chunk: int) -> tuple[float, float, bool]:
    """(speech onset sent -> speech_started received, speech_started -> the reply cut, whether the reply had been
    generated to its end before the user spoke), times in seconds."""
    async with websockets.connect(f"{ws_url}/v1/realtime", max_size=None) as ws:
        arrivals: dict[str, float] = {}
        first_audio = asyncio.Event()

        async def read() -> None:  # a reader of its own: arrival times do not wait for the paced sends
            async for message in ws:
                event = json.loads(message)
                kind, now = event["type"], time.perf_counter()
                if kind == "error":
                    raise RuntimeError(f"the round went wrong: {event}")
                if kind == "session.created":
                    thinker = event["session"]["streamvox"]["responder"] == "thinker"
                    await ws.send(json.dumps({"type": "response.create", "response": {
                        "instructions": THINKER_REPLY if thinker else ECHO_REPLY}}))
                elif kind == "response.output_audio.delta":
                    first_audio.set()
                elif kind in ("input_audio_buffer.speech_started", "response.done", "conversation.item.truncated"):
                    arrivals.setdefault(kind, now)
                    if kind == "conversation.item.truncated":
                        return

        reader = asyncio.create_task(read())
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "create_response": False}}}}}))
        await asyncio.wait([asyncio.ensure_future(first_audio.wait()), reader], timeout=60,
                           return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            reader.result()  # raises what went wrong
        start = time.perf_counter()
        onset_sent = None
        for index, chunk in enumerate(chunks):
            await asyncio.sleep(max(0.0, start + index * CHUNK_MS / 1000 - time.perf_counter()))
            await ws.send(chunk)
            if index == onset_chunk:
                onset_sent = time.perf_counter()
            if reader.done():
                break
        await asyncio.wait_for(reader, 60)
        started = arrivals["input_audio_buffer.speech_started"]
        generated_before = arrivals.get("response.done", started) < onset_sent
        return started - onset_sent, arrivals["conversation.item.truncated"] - started, generated_before


def detecting_chunk(audio: bytes, step: int) -> int:
    """The chunk whose arrival completes the VAD's speech_started (the server's default turn_detection)."""
    vad = SileroVad(VadSettings(), RATE)
    for index, start in enumerate(range(0, len(audio), step)):
        samples = np.frombuffer(audio[start:start + step], "<i2").astype(np.float32) / 32768
        if any(e.kind == "speech_started" for e in vad.process(samples)):
            return index
    raise RuntimeError("the VAD hears no speech in the interruption")


def percentiles(values: list[float]) -> str:
    ms = np.array(values) * 1000
    return f"p50 {np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms, max {ms.max():.1f} ms"


async def measure(ws_url: str, chunks: list[str], onset_chunk: int, rounds: int) -> dict:
    detect, cut, generated = [], [], 0
    for _ in range(rounds):
        latency, cut_after, generated_before = await one_round(ws_url, chunks, onset_chunk)
        detect.append(latency)
        cut.append(cut_after)
        generated += generated_before
    return {"detect": detect, "cut": cut, "generated_before": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start `streamvox serve --model espeak`)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--load", type=int, nargs="+", default=[0, 2], help="CPU-bound processes beside it")
    parser.add_argument("--json", help="write the raw latencies here")
    args = parser.parse_args()
    server = None if args.url else start_server()
    url = args.url or server.url
    ws_url = url.replace("http", "ws", 1)
    try:
        clip = speech(url, INTERRUPTION)
        audio = np.concatenate([np.zeros(int(LEAD_SILENCE_S * RATE), np.int16), clip]).astype("<i2").tobytes()
        step = RATE * CHUNK_MS // 1000 * 2
        chunks = [json.dumps({"type": "input_audio_buffer.append",
                              "audio": base64.b64encode(audio[i:i + step]).decode()})
                  for i in range(0, len(audio), step)]
        onset_chunk = (int(LEAD_SILENCE_S * 1000) + onset_ms(clip)) // CHUNK_MS
        heard_after_s = (detecting_chunk(audio, step) - onset_chunk) * CHUNK_MS / 1000
        results = {}
        print(f"{os.cpu_count()} CPUs; {args.rounds} rounds per load; interruption {len(clip) / RATE:.2f} s of speech "
              f"after {LEAD_SILENCE_S} s of silence, sent in real time as {CHUNK_MS} ms chunks; the VAD hears the "
              f"speech in the chunk sent {heard_after_s * 1000:.0f} ms after the onset's")
        for load in args.load:
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
            try:
                result = asyncio.run(measure(ws_url, chunks, onset_chunk, args.rounds))
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            results[load] = result
            print(f"load {load}:\n  speech onset sent -> speech_started received: {percentiles(result['detect'])}"
                  f"\n  of which after the detecting chunk was sent: "
                  f"{percentiles([t - heard_after_s for t in result['detect']])}"
                  f"\n  speech_started -> conversation.item.truncated: {percentiles(result['cut'])}"
                  f"\n  replies generated to their end before the user spoke: {result['generated_before']} of "
                  f"{args.rounds}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

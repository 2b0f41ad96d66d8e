"""Server VAD turns on `/v1/realtime`: commits cut at the detected speech, noise that starts nothing, a turn whose
transcript is empty, and barge-in on a reply that is generating or still playing.

The server runs in this process (uvicorn in a thread, the espeak engine core in its own process) with a scripted
speech recogniser, so each turn's transcript is known; there is no thinker, so replies come from the echo
responder (it speaks the turn's transcript). The user's audio is espeak speech from the server itself.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
import uvicorn

from streamvox.agent.asr import Transcriber
from streamvox.agent.responder import Responder
from streamvox.audio.g711 import pcm16_to_ulaw
from streamvox.server.app import build_app
from streamvox.settings import AgentSettings, ServerSettings
from tests.helpers.realtime_clients import DELTA_TYPES, RealtimeClient
from tests.helpers.server import free_port

RATE = 24000
TOLERANCE_MS = 100
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}


class ScriptedTranscriber(Transcriber):
    """Says the next line of `script` for each turn (an empty line: nothing was understood)."""

    name = "scripted"
    model = "scripted"

    def __init__(self) -> None:
        self.script: list[str] = []
        self.heard_s: list[float] = []  # the length of each committed turn's audio

    async def stream(self, pcm: np.ndarray, sample_rate: int, request_id: str, language: str | None = None,
                     prompt: str | None = None) -> AsyncIterator[str]:
        self.heard_s.append(len(pcm) / sample_rate)
        if text := (self.script.pop(0) if self.script else ""):
            yield text


@dataclass
class InProcessServer:
    port: int
    transcriber: ScriptedTranscriber
    speech_cache: dict = field(default_factory=dict)

    url = property(lambda self: f"http://127.0.0.1:{self.port}")
    ws_url = property(lambda self: f"ws://127.0.0.1:{self.port}")

    def headers(self) -> dict:
        return {}

    def speech(self, text: str) -> np.ndarray:
        """`text` in espeak's default voice: int16 samples at 24 kHz."""
        if text not in self.speech_cache:
            response = httpx.post(f"{self.url}/v1/audio/speech", timeout=60,
                                  json={"input": text, "response_format": "pcm", "sample_rate": RATE})
            response.raise_for_status()
            self.speech_cache[text] = np.frombuffer(response.content, "<i2")
        return self.speech_cache[text]


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    app = build_app(ServerSettings())
    responder = Responder(AgentSettings())
    transcriber = ScriptedTranscriber()
    responder.transcriber = transcriber
    app.state.streamvox.responder = responder
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                       ws="websockets-sansio"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield InProcessServer(port, transcriber)
    uv.should_exit = True
    thread.join(30)


def speech_span_ms(clip: np.ndarray) -> tuple[int, int]:
    """The clip's speech: its first and last 10 ms frame above -45 dBFS."""
    frames = clip[:len(clip) // 240 * 240].reshape(-1, 240).astype(np.float32) / 32768
    loud = np.flatnonzero(np.sqrt(np.mean(frames ** 2, axis=1)) > 10 ** (-45 / 20))
    return int(loud[0]) * 10, (int(loud[-1]) + 1) * 10


def pink_noise(n: int, rms: float, seed: int = 0) -> np.ndarray:
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    noise = np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(len(spectrum)), 1)), n)
    return noise / np.sqrt(np.mean(noise ** 2)) * rms


def as_pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()


async def append(client: RealtimeClient, data: bytes, chunk_bytes: int = RATE * 2 // 50) -> None:
    """In 20 ms chunks, as a microphone sends it (as fast as the socket takes it)."""
    for start in range(0, len(data), chunk_bytes):
        await client.send({"type": "input_audio_buffer.append",
                           "audio": base64.b64encode(data[start:start + chunk_bytes]).decode()})


async def nothing_more(client: RealtimeClient) -> list[str]:
    """The events the server sends before it answers a probe sent now (so: whatever was on its way)."""
    await client.send({"type": "conversation.item.retrieve", "item_id": "probe_missing", "event_id": "probe"})
    events = await client.until("error")
    assert events[-1]["error"]["event_id"] == "probe"
    return [e["type"] for e in events[:-1]]


async def vad_session(server: InProcessServer, **turn_detection) -> RealtimeClient:
    client = await RealtimeClient.connect(server)
    await client.send({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {**VAD, **turn_detection}}}}})
    await client.expect("session.updated")
    return client


def test_vad_turn_is_cut_at_the_speech_and_noise_alone_starts_nothing(server):
    """Noise, then speech in noise: one turn, its events within 100 ms of the truth, and the committed audio is
    the turn's (from speech start - prefix_padding_ms to speech end + silence_duration_ms)."""
    clip = server.speech("Hello there, how are you today?").astype(np.float64)
    level = np.sqrt(np.mean(clip.astype(np.float64) ** 2))
    start_ms, end_ms = speech_span_ms(clip)
    lead, tail = np.zeros(RATE * 2), np.zeros(RATE * 3 // 2)
    audio = np.concatenate([lead, clip, tail])
    audio += pink_noise(len(audio), level * 10 ** (-10 / 20))  # noise 10 dB below the speech, throughout
    truth_start, truth_end = 2000 + start_ms, 2000 + end_ms

    async def run():
        server.transcriber.script = ["hello there"]
        heard_before = len(server.transcriber.heard_s)
        client = await vad_session(server)
        data = as_pcm16(audio)
        await append(client, data[:RATE * 2 * 2 - 4800])  # the noise alone (all but its last 100 ms)
        assert await nothing_more(client) == []
        await append(client, data[RATE * 2 * 2 - 4800:])
        events = await client.until("response.done")
        names = [e["type"] for e in events]
        started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
        stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
        assert names.count("input_audio_buffer.speech_started") == 1
        assert abs(started["audio_start_ms"] + VAD["prefix_padding_ms"] - truth_start) <= TOLERANCE_MS
        assert abs(stopped["audio_end_ms"] - VAD["silence_duration_ms"] - truth_end) <= TOLERANCE_MS
        assert started["item_id"] == stopped["item_id"]
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        assert committed["item_id"] == stopped["item_id"]
        assert names.index("conversation.item.input_audio_transcription.completed") < names.index("response.created")
        heard = server.transcriber.heard_s[heard_before]
        assert abs(heard * 1000 - (stopped["audio_end_ms"] - started["audio_start_ms"])) <= 1
        assert events[-1]["response"]["status"] == "completed"
        transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
        assert transcript == "hello there"  # the echo responder spoke the turn
        # the audio after the turn stayed in the buffer: a commit now holds the trailing noise, not the turn
        await client.send({"type": "input_audio_buffer.commit"})
        await client.until("conversation.item.input_audio_transcription.completed")
        assert abs(server.transcriber.heard_s[-1] * 1000 - (len(audio) * 1000 / RATE - stopped["audio_end_ms"])) <= 1
        await client.close()

    asyncio.run(run())


def test_a_turn_whose_transcript_is_empty_gets_no_response(server):
    """Noise the VAD took for speech (the recogniser hears no words) is no turn to answer: no response at all."""
    clip = server.speech("Mm.")
    silence = np.zeros(RATE, np.int16)

    async def run():
        server.transcriber.script = ["", "And now a question."]
        client = await vad_session(server)
        await append(client, as_pcm16(np.concatenate([silence, clip, silence])))
        events = await client.until("conversation.item.input_audio_transcription.completed")
        assert events[-1]["transcript"] == ""
        assert "input_audio_buffer.committed" in [e["type"] for e in events]
        assert await nothing_more(client) == []  # no response.created
        await append(client, as_pcm16(np.concatenate([clip, silence])))
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(run())


def test_barge_in_cuts_a_reply_that_is_still_playing(server):
    """The reply's audio is made far faster than real time: its generation is over while the client still plays
    it. Speech then interrupts it all the same: the item is cut at what can have been played by then."""
    silence = np.zeros(RATE, np.int16)
    question, interruption = server.speech("Tell me a story."), server.speech("Wait, stop.")
    story = "Once upon a time, a small boat sailed along the coast for many days and nights. " * 3

    async def run():
        server.transcriber.script = [story, "stop"]
        client = await vad_session(server)
        await append(client, as_pcm16(np.concatenate([silence, question, silence])))
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"  # generated to its end
        first_audio_at = time.monotonic()  # an upper bound: the server sent it earlier
        item_id = events[-1]["response"]["output"][0]["id"]
        reply_ms = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] in DELTA_TYPES) // 48
        assert reply_ms > 10_000
        await asyncio.sleep(1.0)  # the user listens for a second, then talks
        interrupted_at = time.monotonic()
        await append(client, as_pcm16(np.concatenate([interruption, silence])))
        events = await client.until("input_audio_buffer.speech_stopped")
        names = [e["type"] for e in events]
        assert names[0] == "input_audio_buffer.speech_started"
        truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
        assert truncated["item_id"] == item_id and truncated["content_index"] == 0
        played_ms = truncated["audio_end_ms"]
        assert 1000 <= played_ms < reply_ms
        assert played_ms <= (time.monotonic() - first_audio_at) * 1000 + 5000  # no more than the time it played
        assert played_ms >= (interrupted_at - first_audio_at) * 1000 - 1000
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == ""  # no text the user has not heard
        events = await client.until("response.done")  # the interruption is the next turn
        assert events[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(run())


def test_a_reply_cut_by_a_barge_in_is_not_cut_again_later(server):
    """The client stops playing a reply at the barge-in. When no new reply follows (the interruption's transcript
    is empty), a later speech start leaves the cut where it was: cut again later, the transcript would grow back
    to words the user never heard."""
    silence = np.zeros(RATE, np.int16)
    question, interruption = server.speech("Tell me a story."), server.speech("Wait, stop.")
    story = "Once upon a time, a small boat sailed along the coast for many days and nights. " * 3

    async def run():
        server.transcriber.script = [story, "", ""]
        client = await vad_session(server)
        await append(client, as_pcm16(np.concatenate([silence, question, silence])))
        item_id = (await client.until("response.done"))[-1]["response"]["output"][0]["id"]
        await asyncio.sleep(1.0)
        await append(client, as_pcm16(np.concatenate([interruption, silence])))
        first = [e for e in await client.until("input_audio_buffer.speech_stopped")
                 if e["type"] == "conversation.item.truncated"]
        await asyncio.sleep(1.0)
        await append(client, as_pcm16(np.concatenate([interruption, silence])))
        second = await client.until("input_audio_buffer.speech_stopped")
        later = await nothing_more(client)
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        await client.close()
        return first, second, later, item

    first, second, later, item = asyncio.run(run())
    assert len(first) == 1 and first[0]["item_id"] == item["id"]
    assert "conversation.item.truncated" not in [e["type"] for e in second] + later
    assert item["content"][0]["transcript"] == ""


def test_barge_in_stops_a_reply_being_generated_and_a_played_reply_is_left_alone(server):
    silence = np.zeros(RATE, np.int16)
    interruption = server.speech("Wait, stop.")
    long_text = "This sentence keeps the reply running for a good while, so that it can be interrupted. " * 150

    async def run():
        server.transcriber.script = ["stop", "Yes.", "again"]
        client = await vad_session(server)
        await client.send({"type": "response.create", "response": {"instructions": long_text}})
        while (await client.recv())["type"] not in DELTA_TYPES:
            pass
        await append(client, as_pcm16(interruption))
        events = await client.until("response.done")
        assert "input_audio_buffer.speech_started" in [e["type"] for e in events]
        done = events[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
        truncated = await client.until("conversation.item.truncated")
        assert truncated[-1]["item_id"] == done["output"][0]["id"]
        await append(client, as_pcm16(silence))
        events = await client.until("response.done")  # "stop": answered
        # a short reply played to its end: speech after it interrupts nothing
        reply_ms = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] in DELTA_TYPES) // 48
        await asyncio.sleep(reply_ms / 1000 + 0.5)
        await append(client, as_pcm16(np.concatenate([interruption, silence])))
        events = await client.until("input_audio_buffer.speech_stopped")
        assert "conversation.item.truncated" not in [e["type"] for e in events]
        await client.until("response.done")
        await client.close()

    asyncio.run(run())


def test_server_vad_on_g711_input(server):
    clip = server.speech("Hello there, how are you today?")
    start_ms, end_ms = speech_span_ms(clip)
    at_8k = clip[::3]  # espeak's band ends below 4 kHz: plain decimation keeps it
    silence = np.zeros(8000, np.int16)

    async def run():
        server.transcriber.script = ["hello"]
        client = await vad_session(server)
        await client.send({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}})
        await client.expect("session.updated")
        data = pcm16_to_ulaw(np.concatenate([silence, at_8k, silence]))
        await append(client, data, chunk_bytes=160)
        events = await client.until("input_audio_buffer.speech_stopped")
        started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
        assert abs(started["audio_start_ms"] + VAD["prefix_padding_ms"] - (1000 + start_ms)) <= TOLERANCE_MS
        assert abs(events[-1]["audio_end_ms"] - VAD["silence_duration_ms"] - (1000 + end_ms)) <= TOLERANCE_MS
        await client.until("response.done")
        await client.close()

    asyncio.run(run())

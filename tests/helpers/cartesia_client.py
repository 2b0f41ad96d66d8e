"""A raw client of Cartesia's `WS /tts/websocket` for tests: sends context messages, sorts replies by context."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field

import websockets

from tests.helpers.server import Server

KEY = "cartesia-test-key"
RATE = 24000
SETTINGS = {"model_id": "sonic-3", "voice": {"mode": "id", "id": "alloy"}, "language": "en",
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE},
            "add_timestamps": True}


def llm_pieces(text: str) -> list[str]:
    """As an LLM streams it: words with their leading space."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


@dataclass
class Result:
    audio: bytearray = field(default_factory=bytearray)
    words: list[tuple[str, float, float]] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    # seconds of audio received when each timestamps message came, and its last end
    timestamp_checks: list[tuple[float, float]] = field(default_factory=list)

    @property
    def end(self) -> dict | None:
        last = self.messages[-1] if self.messages else None
        return last if last and last["type"] in ("done", "error") else None


class Socket:
    """A raw client: sends context messages, sorts what comes back by context."""

    def __init__(self, ws, rate: int = RATE) -> None:
        self.ws = ws
        self.rate = rate
        self.results: dict[str | None, Result] = defaultdict(Result)

    async def send(self, context_id: str, transcript: str, more: bool, **extra) -> None:
        await self.ws.send(json.dumps({**SETTINGS, **extra, "context_id": context_id, "transcript": transcript,
                                       "continue": more}))

    async def receive(self) -> dict:
        message = json.loads(await self.ws.recv())
        assert "type" in message and "context_id" in message, message
        result = self.results[message["context_id"]]
        result.messages.append(message)
        if message["type"] == "chunk":
            assert message["done"] is False
            result.audio += base64.b64decode(message["data"])
        elif message["type"] == "timestamps":
            stamps = message["word_timestamps"]
            result.words += list(zip(stamps["words"], stamps["start"], stamps["end"], strict=True))
            result.timestamp_checks.append((len(result.audio) / 2 / self.rate, max(stamps["end"])))
        elif message["type"] == "error":
            assert message["done"] is False
        return message

    async def until_ended(self, *context_ids: str, timeout: float = 120) -> None:
        async with asyncio.timeout(timeout):
            while not all(self.results[c].end for c in context_ids):
                await self.receive()


def connect(server: Server, query: str = "?cartesia_version=2025-04-16", headers: dict | None = None):
    return websockets.connect(f"{server.ws_url}/tts/websocket{query}",
                              additional_headers={"X-API-Key": KEY} if headers is None else headers,
                              max_size=None)


async def solo(server: Server, pieces: list[str], **extra) -> Result:
    async with connect(server) as ws:
        socket = Socket(ws)
        for i, piece in enumerate(pieces):
            await socket.send("solo", piece, i < len(pieces) - 1, **extra)
        await socket.until_ended("solo")
        return socket.results["solo"]


def check_context(result: Result, solo: Result | None = None) -> None:
    assert result.end and result.end["type"] == "done", result.messages[-3:]
    assert [m["type"] for m in result.messages].count("done") == 1
    assert len(result.audio) > RATE  # more than half a second
    for audio_s, last_end in result.timestamp_checks:  # timings come after the audio they cover
        assert last_end <= audio_s + 1e-3, (audio_s, last_end)
    starts = [start for _, start, _ in result.words]
    assert starts == sorted(starts) and all(s <= e for _, s, e in result.words)
    if solo is not None:
        assert bytes(result.audio) == bytes(solo.audio)
        assert result.words == solo.words


def active_requests(server: Server, timeout: float = 10) -> float:
    deadline = time.monotonic() + timeout
    while (active := server.metric("streamvox_active_requests")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return active

"""Decoding what the server sends back, the way a client would."""

from __future__ import annotations

import base64
import io
import json

import av
import numpy as np
import soundfile

# eSpeak speaks about 175 words a minute at speed 1.0; clause ends add a pause.
WORDS_PER_SECOND = 175 / 60
CLAUSE_PAUSE_S = 0.25


def estimate_duration(text: str, speed: float = 1.0) -> float:
    words = len(text.split())
    clauses = sum(text.count(p) for p in ".,;:!?")
    return (words / WORDS_PER_SECOND + clauses * CLAUSE_PAUSE_S) / speed


def decode_file(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode a whole response body back to mono float32 samples and their rate."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768, 24000
    if fmt in ("wav", "flac"):
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
        return samples, rate
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    return np.concatenate(frames).astype(np.float32), rate


def parse_sse(body: bytes) -> list[dict]:
    events = []
    for block in body.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


def sse_pcm(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")

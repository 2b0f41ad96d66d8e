"""Golden outputs: the exact bytes a few requests produce, pinned so a refactor cannot change them unseen.

Covers espeak (pcm files, two voices, SSE deltas; a wav file is that pcm behind a streaming header), the tiny
Qwen3-TTS CustomVoice and Base checkpoints (greedy, fixed seed) and one OpenAI Realtime response (its event
sequence and audio). `tests/server/golden/outputs.json` holds a SHA-256 per case, but Qwen3-TTS's audio is
float arithmetic whose last bits depend on the CPU (its vector width in ATen, MKL and oneDNN, and the thread
count: each moved some samples by one step on one machine), so its cases are kept as audio
(`golden/qwen3-*.flac`) and may differ from it by `QWEN3_STEPS` in a few samples. Regenerate them only for an
intended change of output, with `STREAMVOX_WRITE_GOLDEN=1 pytest tests/server/test_golden_outputs.py`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from benchmarks.build_tiny_qwen3 import build
from streamvox.audio.formats import streaming_wav_header
from tests.helpers.audio import parse_sse, sse_pcm
from tests.helpers.realtime_clients import DELTA_TYPES, RealtimeClient, audio_of
from tests.helpers.server import start_server

GOLDEN = Path(__file__).parent / "golden" / "outputs.json"
WRITE = os.environ.get("STREAMVOX_WRITE_GOLDEN") == "1"
TEXT = "Hello world, this is streaming speech!"
QWEN = {"input": TEXT, "language": "english", "temperature": 0, "max_new_tokens": 12,
        "initial_codec_chunk_frames": 2, "seed": 7}
# How far Qwen3-TTS's int16 samples may move from the kept audio, and in what share of them: one step in 0.2%
# of the samples was the most any CPU setting moved them (a code chosen differently moves thousands of steps)
QWEN3_STEPS, QWEN3_MOVED = 2, 0.01


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Golden:
    """Checks outputs against the kept ones, or, with STREAMVOX_WRITE_GOLDEN=1, keeps them."""

    def __init__(self) -> None:
        self.expected = {} if WRITE else json.loads(GOLDEN.read_text())
        self.seen: dict[str, str] = {}

    def __call__(self, name: str, data: bytes) -> None:
        """`data`'s bytes, by their digest."""
        assert data, f"{name}: no output"
        self.seen[name] = _digest(data)
        if not WRITE:
            assert self.seen[name] == self.expected[name], f"{name}: output changed ({len(data)} bytes)"

    def audio(self, name: str, pcm: bytes) -> None:
        """Qwen3-TTS's 24 kHz int16 `pcm`, against the kept audio within `QWEN3_STEPS`."""
        path = GOLDEN.parent / f"{name}.flac"
        samples = np.frombuffer(pcm, np.int16)
        if WRITE:
            soundfile.write(path, samples, 24000, format="FLAC", subtype="PCM_16")
            return
        kept = soundfile.read(path, dtype="int16")[0]
        assert len(samples) == len(kept), f"{name}: {len(samples)} samples, kept {len(kept)}"
        moved = np.abs(samples.astype(np.int32) - kept)
        assert moved.max() <= QWEN3_STEPS and np.mean(moved > 0) <= QWEN3_MOVED, (
            f"{name}: output changed (up to {moved.max()} steps, in {np.mean(moved > 0):.1%} of the samples)")


@pytest.fixture(scope="module")
def golden():
    kept = Golden()
    yield kept
    if WRITE and kept.seen:
        GOLDEN.parent.mkdir(exist_ok=True)
        old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**old, **kept.seen}, indent=1, sort_keys=True) + "\n")


def _post(server, body: dict) -> httpx.Response:
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response


def test_espeak(espeak_server, golden):
    for voice in ("alloy", "echo"):
        pcm = _post(espeak_server, {"input": TEXT, "voice": voice, "response_format": "pcm"}).content
        golden(f"espeak-{voice}-pcm", pcm)
        wav = _post(espeak_server, {"input": TEXT, "voice": voice, "response_format": "wav"}).content
        assert wav == streaming_wav_header(24000) + pcm
        events = parse_sse(_post(espeak_server, {"input": TEXT, "voice": voice, "response_format": "pcm",
                                                 "stream_format": "sse"}).content)
        assert events[-1]["type"] == "speech.audio.done"
        golden(f"espeak-{voice}-sse", sse_pcm(events))
        golden(f"espeak-{voice}-sse-usage", json.dumps(events[-1]["usage"], sort_keys=True).encode())


def _events_shape(events: list[dict]) -> bytes:
    """The realtime event sequence without ids, timestamps or audio payloads. A run of audio deltas counts as one
    entry: how the audio is cut into deltas depends on timing (the bytes are pinned on their own)."""
    shape = []
    for event in events:
        if event["type"] in DELTA_TYPES and shape and shape[-1]["type"] == event["type"]:
            continue
        kept = {k: v for k, v in event.items() if k in ("type", "output_index", "content_index")}
        if event["type"] == "response.done":
            kept["status"] = event["response"]["status"]
            kept["usage"] = event["response"].get("usage")
        if "transcript" in event:
            kept["transcript"] = event["transcript"]
        shape.append(kept)
    return json.dumps(shape, sort_keys=True).encode()


def test_realtime_response(espeak_server, golden):
    async def run() -> list[dict]:
        client = await RealtimeClient.connect(espeak_server)
        try:
            return await client.say(TEXT, instructions=TEXT)
        finally:
            await client.close()

    events = asyncio.run(run())
    golden("realtime-events", _events_shape(events))
    golden("realtime-audio", audio_of(events))


@pytest.mark.timeout(1200)
def test_qwen3_custom_voice(tmp_path_factory, golden):
    model = build(tmp_path_factory.mktemp("golden-cv") / "tiny-cv", "custom_voice", seed=21)
    server = start_server("--model", str(model))
    try:
        pcm = {}
        for voice in ("alice", "bob"):
            pcm[voice] = _post(server, {**QWEN, "voice": voice, "response_format": "pcm"}).content
            golden.audio(f"qwen3-cv-{voice}", pcm[voice])
        events = parse_sse(_post(server, {**QWEN, "voice": "alice", "response_format": "pcm",
                                          "stream_format": "sse"}).content)
        assert sse_pcm(events) == pcm["alice"]
    finally:
        server.stop()


@pytest.mark.timeout(1200)
def test_qwen3_base(tmp_path_factory, golden):
    model = build(tmp_path_factory.mktemp("golden-base") / "tiny-base", "base", seed=22)
    rate = 16000
    t = np.arange(int(1.5 * rate)) / rate
    sample = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, sample, rate, format="WAV", subtype="PCM_16")
    ref = base64.b64encode(buffer.getvalue()).decode()
    server = start_server("--model", str(model))
    try:
        golden.audio("qwen3-base-icl", _post(server, {**QWEN, "ref_audio": ref, "ref_text": "Hi there, friend.",
                                                      "response_format": "pcm"}).content)
        pcm = _post(server, {**QWEN, "ref_audio": ref, "response_format": "pcm"}).content
        golden.audio("qwen3-base-xvector", pcm)
        wav = _post(server, {**QWEN, "ref_audio": ref, "response_format": "wav"}).content
        assert wav == streaming_wav_header(24000) + pcm
    finally:
        server.stop()

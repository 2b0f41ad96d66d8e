"""`--aligner` on a real server with a tiny Qwen3-TTS checkpoint (a model without word timings of its own)."""

from __future__ import annotations

import subprocess
import sys

import httpx

from benchmarks.build_tiny_qwen3 import build
from tests.helpers.audio import parse_sse, sse_pcm
from tests.helpers.server import start_server

BODY = {"input": "Hello world, this is streaming speech!", "response_format": "pcm", "stream_format": "sse",
        "temperature": 0, "max_new_tokens": 12, "initial_codec_chunk_frames": 2}


def test_word_timestamps_need_the_aligner_flag_and_run_with_it(tmp_path):
    model = build(tmp_path / "tiny-cv", "custom_voice", seed=21)
    server = start_server("--model", str(model))
    try:
        refused = httpx.post(f"{server.url}/v1/audio/speech", json={**BODY, "word_timestamps": True}, timeout=300)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "word_timestamps" and "--aligner pocketsphinx" in error["message"]
        plain = parse_sse(httpx.post(f"{server.url}/v1/audio/speech", json=BODY, timeout=300).content)
    finally:
        server.stop()
    server = start_server("--model", str(model), "--aligner", "pocketsphinx")
    try:
        response = httpx.post(f"{server.url}/v1/audio/speech", json={**BODY, "word_timestamps": True}, timeout=300)
        assert response.status_code == 200
        events = parse_sse(response.content)
        # Random weights say nothing a recogniser knows: the request ends normally, with its audio untouched,
        # and with no timings rather than guessed ones.
        assert events[-1]["type"] == "speech.audio.done"
        assert sse_pcm(events) == sse_pcm(plain)
        assert not any(event["type"] == "speech.audio.timestamps" for event in events)
    finally:
        server.stop()


def test_an_unavailable_aligner_is_refused_at_start():
    command = [sys.executable, "-m", "streamvox.cli", "serve", "--aligner", "Qwen/Qwen3-ForcedAligner-0.6B"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "not available yet" in result.stderr and "--aligner pocketsphinx" in result.stderr

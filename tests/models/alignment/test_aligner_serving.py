"""`--aligner` on a real server with a tiny Qwen3-TTS checkpoint (a model without word timings of its own)."""

from __future__ import annotations

import subprocess
import sys

import httpx

from benchmarks.build_tiny_qwen3 import build
from tests.helpers.audio import parse_sse, sse_pcm
from tests.helpers.qwen3_aligner_tiny import build_tiny_aligner
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
        assert error["param"] == "word_timestamps"
        assert "--aligner pocketsphinx" in error["message"] and "--aligner DIR_OR_REPO" in error["message"]
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


def test_the_qwen3_aligner_times_every_word_of_a_stream(tmp_path):
    model = build(tmp_path / "tiny-cv", "custom_voice", seed=21)
    aligner = build_tiny_aligner(tmp_path / "tiny-aligner", seed=0)
    server = start_server("--model", str(model), "--aligner", str(aligner))
    try:
        response = httpx.post(f"{server.url}/v1/audio/speech", json={**BODY, "word_timestamps": True}, timeout=300)
        assert response.status_code == 200
        events = parse_sse(response.content)
    finally:
        server.stop()
    assert events[-1]["type"] == "speech.audio.done"
    timed = [event for event in events if event["type"] == "speech.audio.timestamps"]
    assert timed and events.index(timed[-1]) < len(events) - 1  # every timing before the end
    words = [word for event in timed for word in event["words"]]
    starts = [t for event in timed for t in event["start"]]
    ends = [t for event in timed for t in event["end"]]
    char_starts = [c for event in timed for c in event["char_start"]]
    text = BODY["input"]
    assert words == text.split() and [text[c : c + len(w)] for c, w in zip(char_starts, words, strict=True)] == words
    duration = len(sse_pcm(events)) / 2 / 24000
    assert all(0 <= start <= end <= duration + 1e-3 for start, end in zip(starts, ends, strict=True))
    assert starts == sorted(starts) and ends == sorted(ends)


def test_a_directory_without_a_forced_aligner_is_refused_at_start(tmp_path):
    model = build(tmp_path / "tiny-cv", "custom_voice", seed=21)
    for bad in (str(model), str(tmp_path / "missing" / "dir"), "not-a-repo-id"):
        command = [sys.executable, "-m", "streamvox.cli", "serve", "--model", str(model), "--aligner", bad]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("streamvox: --aligner") and "Qwen3-ForcedAligner" in lines[0]

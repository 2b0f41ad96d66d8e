"""LiveKit's and Pipecat's Cartesia plugins, as released on PyPI, pointed at a real `streamvox serve`.

The plugins live in the clients virtualenv (`bash scripts/setup_clients_venv.sh DIR`; STREAMVOX_CLIENTS_VENV, default
`.clients-venv` in the repository root): these tests run the client scripts beside this file with its python, and
fail (never skip) when it is missing. On eSpeak each case's audio is as long as the server's own clip of the same
text (`POST /tts/bytes`) and its word timings name every word of the text; on the tiny random Qwen3-TTS checkpoint
(with the pocketsphinx aligner, which finds no words in random audio: no timings rather than guessed ones) the
same plugins get audio and a clean end, its 64-frame limit cutting each utterance short.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.build_tiny_qwen3 import build
from tests.clients.test_frameworks import _python
from tests.helpers.server import Server, start_server

TEXT = "Good morning, and welcome aboard the early train. It leaves at nine, and the next one leaves at ten."
API_KEY = "cartesia-plugins-key"
RATE = 24000


@pytest.fixture(scope="module")
def espeak() -> Server:
    server = start_server(api_key=API_KEY)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Server:
    model = build(tmp_path_factory.mktemp("cartesia-plugins") / "tiny-cv", "custom_voice", seed=21)
    server = start_server("--model", str(model), "--aligner", "pocketsphinx", api_key=API_KEY)
    yield server
    server.stop()


def _run(script: str, address: str, voice: str, *args: str) -> dict:
    process = subprocess.run([str(_python()), str(Path(__file__).with_name(script)), address, API_KEY, voice, TEXT,
                              *args], capture_output=True, text=True, timeout=1800)
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def livekit(espeak) -> dict:
    return _run("livekit_cartesia_client.py", espeak.url, "alloy", "10", "stream", "synthesize", "stream-16k",
                "bad-voice")


@pytest.fixture(scope="module")
def pipecat(espeak) -> dict:
    results = _run("pipecat_cartesia_client.py", f"{espeak.ws_url}/tts/websocket", "alloy", "sentence", "token",
                   "interrupt", "http")
    return {**results, "metrics": httpx.get(f"{espeak.url}/metrics", headers=espeak.headers()).text}


def _reference_samples(server: Server, rate: int = RATE) -> int:
    response = httpx.post(f"{server.url}/tts/bytes", headers={"X-API-Key": API_KEY}, timeout=60, json={
        "transcript": TEXT, "voice": {"mode": "id", "id": "alloy"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": rate}})
    assert response.status_code == 200, response.text
    return len(response.content) // 2


def _check_audio(result: dict, server: Server, rate: int = RATE) -> None:
    assert "error" not in result and not result.get("errors"), result
    assert result["sample_rates"] == [rate] and result["channels"] == [1], result
    expected = _reference_samples(server, rate)
    assert abs(result["samples"] - expected) <= 0.02 * expected, (result["samples"], expected)


def _check_words(words: list, samples: int, rate: int = RATE) -> None:
    """Every word of the text with its punctuation, monotone, inside the audio."""
    assert [w.strip() for w, _, _ in words] == TEXT.split(), words
    starts = [start for _, start, _ in words]
    assert starts == sorted(starts) and all(start <= end for _, start, end in words)
    assert words[-1][2] <= samples / rate + 1e-3


def test_livekit_stream_speaks_before_the_input_ends_with_word_timings(livekit, espeak):
    result = livekit["stream"]
    _check_audio(result, espeak)
    assert result["first_audio_s"] < result["input_ended_s"], result
    _check_words(result["words"], result["samples"])


def test_livekit_second_utterance_on_the_reused_socket(livekit, espeak):
    result = livekit["stream"]["second"]
    assert result["connection_reused"] is True
    _check_audio(result, espeak)
    _check_words(result["words"], result["samples"])


def test_livekit_synthesize_and_sample_rate(livekit, espeak):
    _check_audio(livekit["synthesize"], espeak)
    _check_audio(livekit["stream-16k"], espeak, 16000)
    _check_words(livekit["stream-16k"]["words"], livekit["stream-16k"]["samples"], 16000)


def test_livekit_bad_voice_raises_at_once(livekit):
    result = livekit["bad-voice"]
    assert result["raised"] == "APIError" and "no-such-voice" in result["message"], result
    assert result["after_s"] < 2, result


def test_pipecat_sentence_and_token_turns(pipecat, espeak):
    for case in ("sentence", "token"):
        _check_audio(pipecat[case], espeak)
        assert pipecat[case]["words"] == TEXT.split(), (case, pipecat[case]["words"])


def test_pipecat_http_service(pipecat, espeak):
    """`CartesiaHttpTTSService`: one `POST /tts/bytes` per sentence."""
    result = pipecat["http"]
    assert "error" not in result and not result["errors"] and result["sample_rates"] == [RATE], result
    expected = _reference_samples(espeak)
    assert abs(result["samples"] - expected) <= 0.05 * expected, (result["samples"], expected)


def test_pipecat_interruption_cancels_within_a_chunk_and_the_next_turn_works(pipecat, espeak):
    result = pipecat["interrupt"]
    assert result["frames_after_interruption"] <= 1, result
    assert 0 < result["interrupted_turn_samples"] < _reference_samples(espeak)  # six times the text was asked for
    _check_audio(result, espeak)
    assert result["words"][-len(TEXT.split()):] == TEXT.split()
    cancelled = re.search(r'streamvox_requests_total\{route="cartesia",status="cancelled"\} (\S+)', pipecat["metrics"])
    assert cancelled and float(cancelled.group(1)) >= 1, "the cancel reached the server"
    assert espeak.metric("streamvox_active_requests") == 0


def test_both_plugins_on_the_tiny_qwen3_checkpoint(qwen3):
    # The tiny model on a busy 2-core CPU may take longer than LiveKit's 10 s between two chunks.
    livekit = _run("livekit_cartesia_client.py", qwen3.url, "alice", "120", "stream", "synthesize")
    pipecat = _run("pipecat_cartesia_client.py", f"{qwen3.ws_url}/tts/websocket", "alice", "sentence", "token")
    for result in (livekit["stream"], livekit["stream"]["second"], livekit["synthesize"], pipecat["sentence"],
                   pipecat["token"]):
        assert "error" not in result and not result.get("errors"), result
        assert result["sample_rates"] == [RATE] and result["samples"] > 0, result
    for result in (livekit["stream"], livekit["stream"]["second"]):
        if result["words"]:  # the aligner found the words it spoke (the 64-frame limit cuts the text short)
            words = [w.strip() for w, _, _ in result["words"]]
            assert words == TEXT.split()[:len(words)], words


def test_the_ttfa_benchmark_runs():
    """benchmarks/cartesia_ttfa_bench.py, briefly: every path of every text gets audio."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.run([sys.executable, str(root / "benchmarks" / "cartesia_ttfa_bench.py"), "--texts", "2",
                              "--rounds", "1", "--clients-venv", str(_python().parents[1])],
                             capture_output=True, text=True, timeout=600)
    assert process.returncode == 0, process.stderr[-4000:]
    rows = {line.split()[0]: line.split() for line in process.stdout.splitlines()[2:]}
    assert set(rows) == {"openai", "cartesia", "cartesia-words"}, process.stdout
    assert all(row[1] == "2" and row[-1] == "0" for row in rows.values()), process.stdout

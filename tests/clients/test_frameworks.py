"""LiveKit Agents and Pipecat, as released on PyPI, at their defaults against a real `streamvox serve` (espeak).

The frameworks live in a virtualenv of their own (`bash scripts/setup_clients_venv.sh DIR`; STREAMVOX_CLIENTS_VENV,
default `.clients-venv` in the repository root): these tests run the client scripts beside this file with its
python, and fail (never skip) when it is missing. Each case checks the audio the framework decoded: 24 kHz mono,
and as long as the server's own clip of the same text and voice (the frameworks' default voices: LiveKit's TTS
`ash`, its RealtimeModel `marin`, Pipecat's `alloy`), within what the codec pads.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.realtime_clients import reference_pcm
from tests.helpers.server import start_server

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_VENV = Path(os.environ.get("STREAMVOX_CLIENTS_VENV", ROOT / ".clients-venv"))
TEXT = "Good morning. The train to the coast leaves at nine."
API_KEY = "clients-test-key"
RATE = 24000
PCM_TOLERANCE_S = 0.05  # frame rounding in the frameworks
MP3_TOLERANCE_S = 0.15  # an mp3 stream's encoder delay and last-frame padding, per request


def _python() -> Path:
    python = CLIENTS_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"The clients virtualenv is missing at {CLIENTS_VENV}. Create it with "
                    f"`bash scripts/setup_clients_venv.sh {CLIENTS_VENV}` (or set STREAMVOX_CLIENTS_VENV).",
                    pytrace=False)
    return python


@pytest.fixture(scope="module")
def server():
    server = start_server(api_key=API_KEY)
    yield server
    server.stop()


def _run(script: str, server, *cases: str) -> dict:
    process = subprocess.run([str(_python()), str(Path(__file__).with_name(script)), f"{server.url}/v1", API_KEY,
                              TEXT, *cases], capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def livekit(server) -> dict:
    return _run("livekit_client.py", server, "tts-1", "gpt-4o-mini-tts", "stream-adapter", "realtime")


@pytest.fixture(scope="module")
def pipecat(server) -> dict:
    return _run("pipecat_client.py", server, "tts", "realtime")


def _reference_s(server, voice: str | None) -> float:
    return len(reference_pcm(server, TEXT, voice)) / 2 / RATE


def _check_audio(result: dict, expected_s: float, tolerance_s: float) -> None:
    assert "error" not in result, result["error"]
    assert result["sample_rates"] == [RATE] and result["channels"] == [1], result
    seconds = result["samples"] / RATE
    assert abs(seconds - expected_s) <= tolerance_s, f"decoded {seconds:.3f} s, the server's clip {expected_s:.3f} s"


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])
def test_livekit_tts_at_its_defaults(livekit, server, model):
    """mp3, streamed: `stream_format` audio for tts-1, sse for the others."""
    result = livekit[model]
    _check_audio(result, _reference_s(server, "ash"), MP3_TOLERANCE_S)
    assert result["request_ids"] and all(rid.startswith("req_") for rid in result["request_ids"]), result
    assert not result["warnings"], result["warnings"]


def test_livekit_tts_through_stream_adapter(livekit, server):
    """Text pushed word by word; the adapter speaks it a sentence (one request) at a time."""
    result = livekit["stream-adapter"]
    _check_audio(result, _reference_s(server, "ash"), 2 * MP3_TOLERANCE_S)
    assert not result["warnings"], result["warnings"]


def test_livekit_realtime_model_with_its_default_voice(livekit, server):
    result = livekit["realtime"]
    assert result.get("voice") == "marin" and not result.get("errors"), result
    _check_audio(result, _reference_s(server, "marin"), PCM_TOLERANCE_S)
    assert not result["warnings"], result["warnings"]


def test_pipecat_tts_service_at_its_defaults(pipecat, server):
    result = pipecat["tts"]
    assert not result.get("errors"), result
    _check_audio(result, _reference_s(server, "alloy"), PCM_TOLERANCE_S)


def test_pipecat_realtime_llm_service(pipecat, server):
    result = pipecat["realtime"]
    assert not result.get("errors"), result
    _check_audio(result, _reference_s(server, None), PCM_TOLERANCE_S)

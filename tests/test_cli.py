"""`streamvox serve` with a model that cannot load ends with one line naming the cause and the fix (real
subprocesses, no network: HF_HUB_OFFLINE, or a stand-in Hub on a loopback port); a download shows its progress."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import httpx
import pytest

from benchmarks.build_tiny_qwen3 import build
from tests.helpers.fake_hub import FakeHub
from tests.helpers.server import Server, free_port


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build(tmp_path_factory.mktemp("cv") / "tiny-cv", "custom_voice", seed=3)


def _env(tmp_path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_HOME": str(tmp_path / "hf-home"), **extra}  # an empty cache, no token


def _serve_fails(model: str, env: dict) -> str:
    process = subprocess.run([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(free_port()),
                              "--model", model], capture_output=True, text=True, timeout=120, env=env)
    assert process.returncode == 2, (process.returncode, process.stderr[-3000:])
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and not process.stdout.strip(), process.stderr[-3000:]
    assert lines[0].startswith(f"streamvox: cannot load model '{model}': "), lines[0]
    return lines[0]


def test_offline_hub_and_an_uncached_repo_id(tmp_path):
    line = _serve_fails("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", _env(tmp_path, HF_HUB_OFFLINE="1"))
    assert "not in the local Hugging Face cache" in line and "unset HF_HUB_OFFLINE" in line
    assert "--model a local checkpoint directory" in line


def test_unreachable_hub(tmp_path):
    line = _serve_fails("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
                        _env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    assert "cannot reach the Hugging Face Hub" in line and "check the network" in line


def test_wrong_repo_id(tmp_path):
    with FakeHub() as hub:
        line = _serve_fails("Qwen/No-Such-Model", _env(tmp_path, HF_ENDPOINT=hub.url))
    assert "neither a local directory nor a Hugging Face repository" in line and "check the name" in line


def test_path_that_is_neither_a_directory_nor_a_repo_id(tmp_path):
    line = _serve_fails(str(tmp_path / "no" / "such" / "dir"), _env(tmp_path, HF_HUB_OFFLINE="1"))
    assert "neither a local directory nor a Hugging Face repo id" in line and "check the path" in line


@pytest.mark.parametrize("remove", ["config.json", "vocab.json", "speech_tokenizer/model.safetensors"])
def test_directory_missing_files(tmp_path, checkpoint, remove):
    incomplete = tmp_path / "checkpoint"
    shutil.copytree(checkpoint, incomplete)
    (incomplete / remove).unlink()
    line = _serve_fails(str(incomplete), _env(tmp_path, HF_HUB_OFFLINE="1"))
    assert f"it lacks {remove};" in line and "hf download" in line


def test_a_download_shows_its_progress_then_serves(tmp_path, checkpoint):
    log_path = tmp_path / "stderr.txt"
    with FakeHub({"tiny/cv": checkpoint}) as hub, open(log_path, "w") as log:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port),
                                    "--model", "tiny/cv", "--log-level", "warning"], stderr=log,
                                   env=_env(tmp_path, HF_ENDPOINT=hub.url))
        server = Server(process, port)
        try:
            server.wait_healthy()
            response = httpx.post(f"{server.url}/v1/audio/speech", timeout=120,
                                  json={"input": "Hi.", "voice": "alice", "language": "english",
                                        "max_new_tokens": 8, "response_format": "pcm"})
            assert response.status_code == 200 and response.content, response.text[:300]
        finally:
            server.stop()
    progress = log_path.read_text()
    assert "Fetching" in progress and "100%" in progress, progress[-2000:]

"""`streamvox serve` with a model that cannot load ends with one line naming the cause and the fix (real
subprocesses, no network: HF_HUB_OFFLINE, or a stand-in Hub on a loopback port); a download shows its progress."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

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


# --------------------------------------------------------------------------------------------- speak, serve


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamvox.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_speak_checks_its_arguments_before_speaking(tmp_path):
    """Each refusal is one line and a nonzero status, before any speech is made (no traceback)."""
    cases = [(["", "-o", str(tmp_path / "a.wav")], "TEXT is empty"),
             (["\n\t ", "-o", str(tmp_path / "a.flac")], "TEXT is empty"),
             (["x" * 4097, "-o", str(tmp_path / "a.wav")], "longer than 4096"),
             (["Hi.", "-o", str(tmp_path / "a.wav"), "--sample-rate", "7999"], "--sample-rate"),
             (["Hi.", "-o", str(tmp_path / "a.wav"), "--sample-rate", "48001"], "--sample-rate"),
             (["Hi.", "-o", str(tmp_path / "missing" / "a.wav")], "no directory"),
             (["Hi.", "-o", str(tmp_path)], "it is a directory")]
    for args, words in cases:
        process = _cli("speak", *args)
        lines = process.stderr.strip().splitlines()
        assert process.returncode != 0 and len(lines) == 1 and words in lines[0], (args[1:], process.stderr[-2000:])
    assert not any(tmp_path.iterdir())
    process = _cli("serve", "--port", "99999")
    assert process.returncode != 0 and process.stderr.strip() == "streamvox: --port must be between 0 and 65535"


def test_speak_says_the_rate_it_wrote(tmp_path):
    import av

    output = tmp_path / "a.mp3"
    process = _cli("speak", "Hello there.", "-o", str(output), "--sample-rate", "10000")
    assert process.returncode == 0 and process.stdout.strip().endswith("of mp3 at 11025 Hz"), process
    with av.open(str(output)) as container:
        assert container.streams.audio[0].rate == 11025


def test_a_client_that_stops_reading_does_not_hold_a_stopping_server(tmp_path):
    """SIGTERM waits for running requests at most --graceful-shutdown-timeout-s, even for a stream whose client
    reads nothing (its audio then waits on a full socket)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port),
                                "--graceful-shutdown-timeout-s", "2", "--log-level", "warning"],
                               stderr=subprocess.DEVNULL)
    server = Server(process, port)
    try:
        server.wait_healthy()
        body = ('{"input": "%s", "stream_format": "sse"}' % ("A long sentence that goes on and on. " * 110)).encode()
        client = socket.create_connection(("127.0.0.1", port))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 60  # until the stream has started (its metrics say so)
        while "streamvox_active_requests 1.0" not in httpx.get(f"{server.url}/metrics", timeout=10).text:
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)  # without the cap it waited for the client for as long as it stayed
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_drains_running_streams(signum):
    """Ctrl+C in a terminal, or systemd stopping the unit, signals every process of the server, the engine's too:
    a running stream still ends with its audio and its done event, and the server exits by itself."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port),
                                "--log-level", "warning"], stderr=subprocess.DEVNULL, start_new_session=True)
    server = Server(process, port)
    try:
        server.wait_healthy()
        text = "A sentence that takes a while to say, and then some more. " * 12
        with httpx.stream("POST", f"{server.url}/v1/audio/speech", timeout=60,
                          json={"input": text, "stream_format": "sse"}) as response:
            events = response.iter_lines()
            first = next(line for line in events if line.startswith("data: "))
            assert '"speech.audio.delta"' in first
            os.killpg(process.pid, signum)
            rest = [line for line in events if line.startswith("data: ")]
        assert rest and '"speech.audio.done"' in rest[-1], rest[-1:]
        assert not any('"error"' in line for line in rest)
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def _core_ignores_sigint(pid: int) -> bool:
    """Whether `pid` is an engine core (a multiprocessing child) that has set SIGINT aside."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"spawn_main" not in cmdline.read():
                return False
        with open(f"/proc/{pid}/status") as status:
            ignored = next(line for line in status if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def test_ctrl_c_while_the_model_loads_stops_the_engine_too():
    """The engine core ignores SIGINT and SIGTERM (the server stops it), so a server interrupted before it serves
    must stop the core itself: nothing of the group is left, and it exits at once."""
    process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(free_port()),
                                "--log-level", "warning"], stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(_core_ignores_sigint(pid) for pid in _group(process.pid)):  # the core loads its model
            assert time.monotonic() < deadline and process.poll() is None, "the engine core did not start"
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while _group(process.pid):
            assert time.monotonic() < deadline, f"left running: {_group(process.pid)}"
            time.sleep(0.05)
    finally:
        if _group(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_port_in_use_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = subprocess.run([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port)],
                                 capture_output=True, text=True, timeout=60)
    assert process.returncode == 1, process
    assert process.stderr.strip() == f"streamvox: cannot listen on 127.0.0.1 port {port}: Address already in use"

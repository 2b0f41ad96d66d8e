"""The engine process dies mid-stream: the server reports it, recovers, or exits for a supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.helpers.audio import parse_sse
from tests.helpers.server import start_server

LONG_TEXT = "The engine keeps talking for a long while here. " * 80


def _stream_until_killed(server, result: dict) -> None:
    body = {"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"}
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=30) as response:
        result["body"] = response.read()


def test_killed_engine_turns_health_503_ends_streams_with_error_and_restarts():
    server = start_server()
    try:
        pid = httpx.get(f"{server.url}/health").json()["engine_pid"]
        # Slow the stream down: a client that reads nothing keeps its request open in the server.
        result: dict = {}
        reader = threading.Thread(target=_stream_until_killed, args=(server, result))
        reader.start()
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        saw_503_after = None
        while time.monotonic() - killed_at < 1.0:
            if httpx.get(f"{server.url}/health").status_code == 503:
                saw_503_after = time.monotonic() - killed_at
                break
            time.sleep(0.02)
        reader.join(10)
        # The restarted engine serves again.
        server.wait_healthy(60)
        health = httpx.get(f"{server.url}/health").json()
        response = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Back again."})
    finally:
        server.stop()
    events = parse_sse(result["body"])
    assert saw_503_after is not None, "health did not turn 503 within 1 s"
    # Either the stream had already completed before the kill, or it ended with a clear error event.
    assert events[-1]["type"] in ("error", "speech.audio.done")
    if events[-1]["type"] == "error":
        assert events[-1]["error"]["code"] == "engine_unavailable"
    assert health["engine_restarts"] == 1 and health["engine_pid"] != pid
    assert response.status_code == 200 and len(response.content) > 1000


def test_sigint_shuts_the_server_down_quietly_with_status_0(tmp_path):
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        server = start_server(stderr=stderr)
        server.stop()  # SIGINT, as Ctrl-C
    assert server.process.returncode == 0
    assert "Traceback" not in log.read_text(), log.read_text()[-2000:]


def test_exit_on_engine_crash_exits_non_zero():
    server = start_server("--exit-on-engine-crash")
    try:
        pid = httpx.get(f"{server.url}/health").json()["engine_pid"]
        os.kill(pid, signal.SIGKILL)
        code = server.process.wait(15)
    finally:
        server.stop()
    assert code == 3


def test_engine_failing_at_restart_backs_off_then_recovers(tmp_path):
    """An engine that fails at start after a crash is retried with growing waits, not in a tight loop."""
    fault = tmp_path / "engine-start-fails"
    server = start_server("--engine-restart-backoff-max-s", "2",
                          env={"STREAMVOX_FAULT_ENGINE_START_FILE": str(fault)})
    try:
        pid = httpx.get(f"{server.url}/health").json()["engine_pid"]
        fault.touch()
        os.kill(pid, signal.SIGKILL)
        while httpx.get(f"{server.url}/health").status_code == 200:  # until the front end sees the death
            time.sleep(0.02)
        start = time.monotonic()
        waits, restarts = [], 0
        while time.monotonic() - start < 10:
            health = httpx.get(f"{server.url}/health").json()
            assert health["status"] == "unavailable"
            restarts = health["engine_restarts"]
            if "engine_restart_in_s" in health:
                waits.append(health["engine_restart_in_s"])
            time.sleep(0.05)
        failures = health["engine_consecutive_failures"]
        # Waits 0, 0.5, 1, 2, 2, ... between attempts (each failing start itself takes ~1-2 s here, to import).
        assert 3 <= restarts <= 6, restarts
        assert failures >= 3 and 1.0 < max(waits) <= 2.0, (failures, waits)
        # Server still answers requests with a clean 503 while the engine is down.
        response = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Anyone there?"})
        assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"
        fault.unlink()
        server.wait_healthy(15)
        response = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Back again."})
        assert response.status_code == 200 and len(response.content) > 1000
        assert server.process.poll() is None
    finally:
        server.stop()


def test_engine_failing_at_first_start_exits_instead_of_looping():
    started = time.monotonic()
    process = subprocess.run([sys.executable, "-m", "streamvox.cli", "serve", "--port", "0", "--model",
                              "/nonexistent/model/dir", "--log-level", "warning"], capture_output=True, timeout=60)
    assert process.returncode != 0
    assert time.monotonic() - started < 30
    assert b"streamvox: cannot load model '/nonexistent/model/dir'" in process.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie waiting for its reaper has exited
    except FileNotFoundError:
        return False


def _read_until_cut(server) -> None:
    try:
        _stream_until_killed(server, {})
    except httpx.HTTPError:
        pass  # the server was killed: expected


def test_engine_core_exits_when_the_server_is_killed_mid_stream():
    """A SIGKILLed server leaves its engine core orphaned with requests running: the core must notice and exit
    (it used to block forever sending audio nobody reads, holding its synthesis children)."""
    server = start_server()
    try:
        engine_pid = httpx.get(f"{server.url}/health").json()["engine_pid"]
        readers = [threading.Thread(target=_read_until_cut, args=(server,), daemon=True) for _ in range(64)]
        for reader in readers:
            reader.start()
        time.sleep(1.0)
        server.process.kill()
        server.process.wait(10)
        deadline = time.monotonic() + 15
        while _alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(engine_pid), "the engine core outlived its server"
    finally:
        server.stop()
        if _alive(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)

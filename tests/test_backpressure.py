"""A client that stops reading is dropped after `--max-buffered-audio-s` of queued audio; memory stays bounded."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import websockets.sync.client as ws_client

from benchmarks.soak_disconnects import rss_kib
from tests.audio_helpers import parse_sse
from tests.conftest import start_server

LONG_TEXT = "The engine keeps talking for a long while here, on and on. " * 68  # ~4000 chars, ~4 min of audio
LIMIT_S = 3.0


@pytest.fixture(scope="module")
def limited_server():
    server = start_server("--max-buffered-audio-s", str(LIMIT_S))
    yield server
    server.stop()


def stalled_http_client(server) -> socket.socket:
    """POST an SSE request, then read nothing (a small receive buffer, so the server feels it soon)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    body = json.dumps({"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def read_all(sock: socket.socket, timeout: float = 30) -> bytes:
    sock.settimeout(timeout)
    parts = []
    while True:
        data = sock.recv(1 << 20)
        if not data or b"0\r\n\r\n" in data[-7:]:
            parts.append(data)
            return b"".join(parts)
        parts.append(data)


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_stalled_http_clients_are_cancelled_and_memory_stays_bounded(limited_server):
    server = limited_server
    rss_before = rss_kib(server.process.pid)
    stalled = [stalled_http_client(server) for _ in range(3)]
    try:
        assert wait_for(lambda: server.metric("streamvox_active_requests") == 3, 10)
        # A client reading at full speed, meanwhile, is not affected by the small limit.
        good: dict = {}
        reader = threading.Thread(target=lambda: good.setdefault("r", httpx.post(
            f"{server.url}/v1/audio/speech", json={"input": LONG_TEXT[:1500], "response_format": "pcm",
                                                    "stream_format": "sse"}, timeout=120)))
        reader.start()
        assert wait_for(lambda: server.metric("streamvox_active_requests") == 0, 90), "stalled requests not dropped"
        rss_peak = rss_kib(server.process.pid)
        reader.join(120)
        bodies = [read_all(sock) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    for body in bodies:
        assert b'"code":"slow_consumer"' in body and b"speech.audio.done" not in body
    events = parse_sse(good["r"].content)
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    # Unbounded, each stalled request would queue ~4 min of float32 audio at 22 kHz (~20 MiB) in the server.
    assert (rss_peak - rss_before) / 1024 < 25, f"server RSS grew {(rss_peak - rss_before) / 1024:.0f} MiB"


def test_stalled_websocket_client_is_cancelled(limited_server):
    server = limited_server
    ws = ws_client.connect(f"{server.ws_url}/v1/audio/speech/stream", max_size=None, max_queue=1,
                           open_timeout=10)
    try:
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        assert wait_for(lambda: server.metric("streamvox_active_requests") == 1, 10)
        assert wait_for(lambda: server.metric("streamvox_active_requests") == 0, 90), "stalled WS not dropped"
        done, errors = None, []
        while done is None:
            message = ws.recv(30)
            if isinstance(message, str):
                event = json.loads(message)
                if event["type"] == "error":
                    errors.append(event["code"])
                elif event["type"] == "audio.done":
                    done = event
    finally:
        ws.close()
    assert errors == ["slow_consumer"] and done["reason"] == "error", (errors, done)

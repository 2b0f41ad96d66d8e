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
from tests.helpers.audio import parse_sse
from tests.helpers.server import start_server

LONG_TEXT = "The engine keeps talking for a long while here, on and on. " * 68  # ~4000 chars, ~4 min of audio
# Small next to the ~4 min a stalled request would queue, but above what eSpeak can deliver in one burst
# (the front end takes up to 256 engine messages per wake-up, ~13 s of eSpeak audio): below that, even a client
# reading at full speed can be cut off (docs/LIMITS.md says so).
LIMIT_S = 30.0
STALLED = 4


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


def full_speed_read(server, text: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", timeout=120,
                      json={"input": text, "response_format": "pcm", "stream_format": "sse"})


def test_stalled_http_clients_are_cancelled_and_memory_stays_bounded(limited_server):
    server = limited_server
    # Warm up (allocator arenas, imports, caches) with the same load read at full speed, then take the baseline.
    for _ in range(2):
        warm = [threading.Thread(target=full_speed_read, args=(server, LONG_TEXT)) for _ in range(STALLED)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join(120)
    rss_before = rss_kib(server.process.pid)
    stalled = [stalled_http_client(server) for _ in range(STALLED)]
    try:
        # (eSpeak makes audio far faster than real time: the limit is reached within a second or so.)
        assert wait_for(lambda: server.metric("streamvox_active_requests") == 0, 90), "stalled requests not dropped"
        time.sleep(2)
        rss_stalled = rss_kib(server.process.pid)
        # A client reading at full speed, meanwhile, is not affected by the limit.
        good = full_speed_read(server, LONG_TEXT)
        bodies = [read_all(sock) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    for body in bodies:
        assert b'"code":"slow_consumer"' in body and b"speech.audio.done" not in body
    events = parse_sse(good.content)
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    # Unbounded (the default 300 s is longer than this text), each stalled client makes the server hold its whole
    # clip: ~4 min of float32 audio at 22 kHz, ~20 MiB (6 clients measured +55 MiB). With the 30 s limit, 6 clients
    # measured +5 MiB (and +90 MiB before merged deltas were capped at 1 s: the backlog was copied in one piece).
    growth = (rss_stalled - rss_before) / 1024
    assert growth < 20, f"server RSS grew {growth:.0f} MiB with {STALLED} stalled clients"


def request_count(server, route: str, status: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    for line in text.splitlines():
        if line.startswith("streamvox_requests_total{") and f'route="{route}"' in line and f'status="{status}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_stalled_websocket_client_is_cancelled(limited_server):
    """A `/v1/audio/speech/stream` client that reads nothing is dropped once a send has waited `LIMIT_S`:
    its engine request ends as an error (slow_consumer) long before its ~4 min clip could have been delivered
    (eSpeak speaks it sentence by sentence, so no single request queues `LIMIT_S` of audio in the engine)."""
    server = limited_server
    errors_before = request_count(server, "speech_stream", "error")
    with ws_client.connect(f"{server.ws_url}/v1/audio/speech/stream", max_size=None, max_queue=1,
                           open_timeout=10, ping_interval=None) as ws:
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        assert wait_for(lambda: request_count(server, "speech_stream", "error") == errors_before + 1, LIMIT_S + 30), \
            "the stalled WebSocket's request was not cancelled"
        assert server.metric("streamvox_active_requests") == 0
        assert request_count(server, "speech_stream", "ok") == 0

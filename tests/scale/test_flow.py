"""Flow control across Serve's proxy: the replica's send window, then stalled readers on a real cluster, who are
cancelled at `--max-buffered-audio-s` while the proxy's memory stays bounded (as tests/server/test_backpressure.py
checks without Ray)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import websockets.sync.client as ws_client

from streamvox.scale.flow import ACK, WINDOW_BYTES, SendWindow
from streamvox.server.app import ServerSettings
from tests.helpers.audio import parse_sse
from tests.helpers.ray_serve import proxy_pid, serve_cluster
from tests.server.test_backpressure import LIMIT_S, LONG_TEXT, read_all, wait_for


class Channel:
    """The replica's side of Serve's receive channel (fed by the test) and what reached the proxy."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)


def chunk(size: int) -> dict:
    return {"type": "http.response.body", "body": b"x" * size, "more_body": True}


def test_send_window_holds_the_app_until_the_proxy_acks():
    async def run():
        channel = Channel()
        window = SendWindow(channel.receive, channel.send)
        await window.send({"type": "http.response.start", "status": 200, "headers": []})
        await window.send(chunk(WINDOW_BYTES))  # exactly the window: not held
        held = asyncio.ensure_future(window.send(chunk(1000)))
        await asyncio.sleep(0.05)
        assert not held.done() and len(channel.sent) == 3  # sent, but the app waits
        channel.incoming.put_nowait({"type": ACK, "delivered": 100})  # not enough
        await asyncio.sleep(0.05)
        assert not held.done()
        channel.incoming.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        channel.incoming.put_nowait({"type": ACK, "delivered": 1000})
        await asyncio.wait_for(held, 1)
        assert await window.receive() == {"type": "http.request", "body": b"", "more_body": False}  # acks removed
        window.close()

    asyncio.run(run())


def test_send_window_lets_go_when_the_client_leaves():
    async def run():
        channel = Channel()
        window = SendWindow(channel.receive, channel.send)
        held = asyncio.ensure_future(window.send(chunk(WINDOW_BYTES + 1)))
        await asyncio.sleep(0.05)
        assert not held.done()
        channel.incoming.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(held, 1)
        assert await window.receive() == {"type": "http.disconnect"}
        assert await window.receive() == {"type": "http.disconnect"}  # and again, as ASGI servers do
        window.close()

    asyncio.run(run())


@pytest.fixture(scope="module")
def limited(request, tmp_path_factory):
    cluster = serve_cluster(request)
    settings = ServerSettings(max_buffered_audio_s=LIMIT_S, voices_dir=str(tmp_path_factory.mktemp("voices")))
    cluster.deploy(settings, replicas=1, max_streams=8, max_queued=8)
    yield cluster
    cluster.delete()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def stalled_sse(cluster) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", cluster.port))
    body = json.dumps({"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def full_speed(cluster) -> list[dict]:
    response = httpx.post(f"{cluster.url}/v1/audio/speech", timeout=120,
                          json={"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"})
    return parse_sse(response.content)


def metric(cluster, name: str, route: str | None = None, status: str | None = None) -> float:
    total = 0.0
    for line in httpx.get(f"{cluster.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and (route is None or f'route="{route}"' in line) \
                and (status is None or f'status="{status}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def stalled_websocket(cluster, done: threading.Event) -> None:
    with ws_client.connect(f"{cluster.ws_url}/v1/audio/speech/stream", max_size=None, max_queue=1,
                           open_timeout=10, ping_interval=None) as ws:
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        done.wait(LIMIT_S + 60)


def test_stalled_readers_are_cancelled_through_the_proxy_and_its_memory_stays_bounded(limited):
    proxy = proxy_pid()
    for _ in range(2):  # warm up the proxy and the replica with the same load, read at full speed
        warm = [threading.Thread(target=full_speed, args=(limited,)) for _ in range(2)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join(120)
    rss_before = rss_kib(proxy)
    ws_errors = metric(limited, "streamvox_requests_total{", "speech_stream", "error")
    ws_done = threading.Event()
    ws_thread = threading.Thread(target=stalled_websocket, args=(limited, ws_done))
    ws_thread.start()
    stalled = [stalled_sse(limited) for _ in range(2)]
    try:
        # Only the stalled WebSocket is left once the SSE requests are cancelled (eSpeak reaches the limit fast).
        assert wait_for(lambda: metric(limited, "streamvox_active_requests") <= 1, 90), "stalled requests went on"
        time.sleep(2)
        growth = (rss_kib(proxy) - rss_before) / 1024
        good = full_speed(limited)  # a client reading at full speed is not affected
        # The stalled WebSocket's request ends once one of its sends has waited LIMIT_S.
        assert wait_for(lambda: metric(limited, "streamvox_requests_total{", "speech_stream", "error")
                        == ws_errors + 1, LIMIT_S + 45), "the stalled WebSocket's request was not cancelled"
        bodies = [read_all(sock) for sock in stalled]
    finally:
        ws_done.set()
        for sock in stalled:
            sock.close()
        ws_thread.join(30)
    for body in bodies:
        assert b'"code":"slow_consumer"' in body and b"speech.audio.done" not in body
    assert good[-1]["type"] == "speech.audio.done"
    # Unbounded, the proxy would take each stalled clip whole (~15 MB of SSE each) from the replica.
    assert growth < 10, f"the proxy's RSS grew {growth:.0f} MiB with 2 stalled SSE clients"

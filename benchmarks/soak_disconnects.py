"""Soak: many requests whose clients disconnect at random points mid-stream.

Checks that the server frees what each request held: after the run the
active-request gauge returns to 0, no WebSocket session stays open, and the
API process's resident memory (VmRSS from /proc/<pid>/status) is within 10%
of what it was after a warm-up. The engine process's RSS (with its request
children) is printed too.

Each request picks one pattern (seeded, so runs are repeatable):
  full         read a streamed response to the end
  headers      send the request, close before the response starts (after 0-50 ms)
  mid-stream   read a random number of bytes (0-200 KB) of an SSE / chunked stream, then drop the connection
               (half the time a reset, half a clean close)
  file         a non-streaming request, dropped after 0-200 ms
  ws-stream    WS /v1/audio/speech/stream: send text, read a few frames, drop the socket
  ws-realtime  WS /v1/realtime: response.create, read a few events, drop the socket

Example (starts its own server):
  python benchmarks/soak_disconnects.py --requests 1000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

import httpx
import websockets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TEXTS = [
    "The quick brown fox jumps over the lazy dog, then rests beneath a tall oak tree near the river.",
    "Real-time speech needs a short time to the first packet and no gaps while it plays. " * 3,
    "Every request keeps its own state, so concurrent streams never bleed into each other. " * 6,
    "Short one.",
]
# RSS is read this long after the server went idle: it trims its heap ~2-4 s after the last request ends
# (streamvox/server/housekeeping.py).
SETTLE_S = 5.0
PATTERNS = ["full", "headers", "mid-stream", "mid-stream", "mid-stream", "file", "ws-stream", "ws-realtime"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and its descendants (the engine forks a process per request)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += rss_kib(current)
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo += [int(c) for c in children.read().split()]
        except (OSError, RuntimeError):
            pass
    return total


@dataclass
class Soak:
    host: str
    port: int
    headers: dict
    rng: random.Random
    counts: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)

    def body(self, stream_format: str | None) -> bytes:
        body = {"input": self.rng.choice(TEXTS), "response_format": "pcm", "voice": self.rng.choice(["alloy", "nova"])}
        if stream_format:
            body["stream_format"] = stream_format
        return json.dumps(body).encode()

    def http_request(self, body: bytes) -> bytes:
        lines = ["POST /v1/audio/speech HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def one(self, pattern: str) -> None:
        self.counts[pattern] = self.counts.get(pattern, 0) + 1
        if pattern.startswith("ws-"):
            await self.websocket(pattern)
        else:
            await self.http(pattern)

    async def http(self, pattern: str) -> None:
        stream_format = None if pattern == "file" else self.rng.choice(["sse", "audio"])
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(self.http_request(self.body(stream_format)))
            await writer.drain()
            if pattern == "headers":
                await asyncio.sleep(self.rng.uniform(0, 0.05))
            elif pattern == "file":
                await asyncio.wait_for(reader.read(1), self.rng.uniform(0, 0.2))
            elif pattern == "mid-stream":
                want, got = self.rng.randint(0, 200_000), 0
                while got < want:
                    data = await reader.read(65536)
                    if not data:
                        break
                    got += len(data)
            else:  # full
                head = await reader.readuntil(b"\r\n\r\n")
                if b" 200 " not in head.split(b"\r\n", 1)[0]:
                    self.errors.append(head[:200])
                while await reader.read(65536):
                    pass
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if pattern == "mid-stream" and self.rng.random() < 0.5:  # RST instead of FIN
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort() if self.rng.random() < 0.5 else writer.close()

    async def websocket(self, pattern: str) -> None:
        path = "/v1/audio/speech/stream" if pattern == "ws-stream" else "/v1/realtime?model=espeak"
        try:
            ws = await websockets.connect(f"ws://{self.host}:{self.port}{path}", additional_headers=self.headers,
                                          max_size=None, open_timeout=30)
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            self.errors.append(f"ws connect: {exc}")
            return
        try:
            text = self.rng.choice(TEXTS)
            if pattern == "ws-stream":
                await ws.send(json.dumps({"type": "input.text", "text": text}))
                if self.rng.random() < 0.7:
                    await ws.send(json.dumps({"type": "input.done"}))
            else:
                await ws.recv()  # session.created
                await ws.send(json.dumps({"type": "response.create", "response": {"instructions": text}}))
            for _ in range(self.rng.randint(0, 8)):
                await asyncio.wait_for(ws.recv(), 10)
        except (OSError, websockets.WebSocketException, TimeoutError):
            pass
        finally:
            ws.transport.abort()  # no close handshake: the client just vanishes


async def run_soak(url: str, requests: int, concurrency: int, seed: int = 0, headers: dict | None = None,
                   time_limit_s: float = 900.0) -> dict:
    parts = httpx.URL(url)
    soak = Soak(parts.host, parts.port, headers or {}, random.Random(seed))
    patterns = [soak.rng.choice(PATTERNS) for _ in range(requests)]
    queue: asyncio.Queue = asyncio.Queue()
    for p in patterns:
        queue.put_nowait(p)

    start = time.monotonic()
    done = 0

    async def worker() -> None:
        nonlocal done
        while not queue.empty() and time.monotonic() - start < time_limit_s:
            await soak.one(queue.get_nowait())
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"requests": done, "requests_planned": requests, "seconds": time.monotonic() - start,
            "patterns": soak.counts, "client_errors": soak.errors[:5], "n_client_errors": len(soak.errors)}


def metric(url: str, name: str, headers: dict) -> float:
    for line in httpx.get(f"{url}/metrics", headers=headers, timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def wait_idle(url: str, headers: dict, timeout: float = 30.0) -> tuple[float, float, float]:
    """Wait for 0 active requests and 0 WS sessions; (seconds waited, active, sessions)."""
    start = time.monotonic()
    while True:
        active = metric(url, "streamvox_active_requests", headers)
        sessions = metric(url, "streamvox_websocket_sessions", headers)
        if (active == 0 and sessions == 0) or time.monotonic() - start > timeout:
            return time.monotonic() - start, active, sessions
        time.sleep(0.1)


def soak(server, requests: int, concurrency: int, warmup: int, seed: int = 0, time_limit_s: float = 900.0) -> dict:
    """Warm up, measure RSS, run the soak, wait for idle, measure again."""
    headers = server.headers()
    asyncio.run(run_soak(server.url, warmup, concurrency, seed + 1, headers))
    wait_idle(server.url, headers)
    time.sleep(SETTLE_S)
    engine_pid = httpx.get(f"{server.url}/health", headers=headers).json()["engine_pid"]
    rss_start, engine_start = rss_kib(server.process.pid), tree_rss_kib(engine_pid)
    result = asyncio.run(run_soak(server.url, requests, concurrency, seed, headers, time_limit_s))
    waited, active, sessions = wait_idle(server.url, headers)
    time.sleep(SETTLE_S)
    rss_end, engine_end = rss_kib(server.process.pid), tree_rss_kib(engine_pid)
    health = httpx.get(f"{server.url}/health", headers=headers, timeout=10).json()
    after = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Still fine.", "response_format": "pcm"},
                       headers=headers, timeout=60)
    result.update({
        "idle_after_s": round(waited, 2), "active_after": active, "ws_sessions_after": sessions,
        "api_rss_start_mib": round(rss_start / 1024, 1), "api_rss_end_mib": round(rss_end / 1024, 1),
        "api_rss_ratio": round(rss_end / rss_start, 3),
        "engine_tree_rss_start_mib": round(engine_start / 1024, 1),
        "engine_tree_rss_end_mib": round(engine_end / 1024, 1),
        "engine_restarts": health.get("engine_restarts"), "request_after_ok": after.status_code == 200,
        "seconds": round(result["seconds"], 1),
    })
    return result


def main() -> int:
    from tests.helpers.server import start_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit-s", type=float, default=900, help="give up (exit 2) after this long")
    args = parser.parse_args()
    server = start_server()
    try:
        result = soak(server, args.requests, args.concurrency, args.warmup, args.seed, args.time_limit_s)
    finally:
        server.stop()
    print(json.dumps(result, indent=2))
    ok = (result["requests"] == args.requests and result["active_after"] == 0 and result["ws_sessions_after"] == 0
          and result["api_rss_ratio"] <= 1.10
          and result["request_after_ok"] and result["engine_restarts"] == 0)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Two espeak replicas behind Ray Serve's proxy on a local loopback cluster: every protocol, the client
headers Serve obeys, overload, health, a killed replica and a scale-down (streamvox.scale)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
import websockets

from streamvox.server.app import ServerSettings
from tests.helpers.audio import parse_sse, sse_pcm
from tests.helpers.ray_serve import health_by_replica, is_running, parent_pid, serve_cluster
from tests.helpers.realtime_clients import DELTA_TYPES
from tests.server.test_realtime_text_stream import StreamClient

TEXT = "The quick brown fox jumps over the lazy dog, then rests beneath a tall oak tree near the river."
# About a minute of audio (~2.9 MB of 24 kHz PCM).
MINUTE_TEXT = "The engine keeps talking for a long while here, on and on. " * 17
# Slow readers: ~3 minutes of audio read at 1 MB/s, through a small socket buffer (the server side feels the
# reader's pace), stay in flight for ~10 s. (Much smaller buffers make loopback TCP itself crawl.)
LONG_TEXT = MINUTE_TEXT * 3
READ_BYTES_PER_S = 1_000_000
READER_RCVBUF = 64 * 1024


@pytest.fixture(scope="module")
def replicas(request, tmp_path_factory):
    cluster = serve_cluster(request)
    settings = ServerSettings(voices_dir=str(tmp_path_factory.mktemp("voices")))
    cluster.deploy(settings, max_streams=8, max_queued=8, graceful_shutdown_timeout_s=60)
    cluster.settings = settings
    yield cluster
    cluster.delete()


def speech(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


def replica_of(response) -> str:
    return response.headers["x-streamvox-replica"]


def test_every_protocol_through_the_proxy_matches_a_direct_server(replicas, espeak_server):
    url, direct = replicas.url, espeak_server.url
    for body in ({"input": TEXT, "response_format": "wav"},
                 {"input": TEXT, "response_format": "pcm", "voice": "onyx", "stream_format": "audio"}):
        through = speech(url, **body)
        assert through.status_code == 200 and replica_of(through)
        assert through.content == speech(direct, **body).content
    reference = speech(direct, input=TEXT, response_format="pcm").content
    events = parse_sse(speech(url, input=TEXT, response_format="pcm", stream_format="sse").content)
    assert events[-1]["type"] == "speech.audio.done" and sse_pcm(events) == reference

    async def text_stream() -> bytes:
        client = await StreamClient.connect(replicas)
        assert client.ws.response.headers["x-streamvox-replica"]
        await client.send(type="input.text", text=TEXT)
        await client.send(type="input.done")
        _, pcm, _ = await client.utterance()
        await client.ws.close()
        return pcm

    async def realtime() -> bytes:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", websocket_base_url=f"{replicas.ws_url}/v1", api_key="x")
        async with sdk.realtime.connect(model="espeak") as connection:
            await connection.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]})
            await connection.response.create()
            audio = bytearray()
            async for event in connection:
                if event.type in DELTA_TYPES:
                    audio += base64.b64decode(event.delta)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    return bytes(audio)
        raise AssertionError("the session ended before response.done")

    assert asyncio.run(text_stream()) == reference
    assert asyncio.run(realtime()) == reference


def test_requests_spread_over_both_replicas(replicas):
    """Serve's router sends a request to the replica with fewer in flight. Each stream is held open until all six
    are placed: a whole request takes about 0.2 s here, so requests that ran to their end would find both replicas
    idle, and the router would place them by coin flips (all six on one replica about one run in thirty)."""
    count = 6

    async def one(client: httpx.AsyncClient, delay: float, placed: list[str], all_placed: asyncio.Event) -> None:
        await asyncio.sleep(delay)  # Serve's router sees each replica's load before it places the next request
        body = {"input": MINUTE_TEXT, "response_format": "pcm"}
        async with client.stream("POST", f"{replicas.url}/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            placed.append(replica_of(response))
            if len(placed) == count:
                all_placed.set()
            await asyncio.wait_for(all_placed.wait(), 60)

    async def run() -> list[str]:
        placed: list[str] = []
        all_placed = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:
            await asyncio.gather(*(one(client, 0.2 * i, placed, all_placed) for i in range(count)))
        return placed

    placed = asyncio.run(run())
    assert len(placed) == count and len(set(placed)) == 2
    seen = health_by_replica(replicas.url, 2)
    assert all(health["replica"] == name for name, health in seen.items())


def test_client_timeout_header_cuts_nothing(replicas):
    """`x-request-timeout-seconds` never reaches Serve: a slowly read stream and an idle session outlive it."""
    headers = {"x-request-timeout-seconds": "0.5"}

    async def run():
        result: dict = {}
        await _slow_http(replicas.url, SSE, result, 4_000_000, headers)  # ~3 s for ~12 MB
        events = parse_sse(result["body"])
        assert "error" not in result and events[-1]["type"] == "speech.audio.done"
        async with websockets.connect(f"{replicas.ws_url}/v1/audio/speech/stream", additional_headers=headers) as ws:
            await asyncio.sleep(1.5)
            client = StreamClient(ws)
            await client.send(type="input.text", text=TEXT)
            await client.send(type="input.done")
            await client.utterance()

    asyncio.run(run())


def _requests_total(url: str, route: str, status: str) -> float:
    """A request counter summed over both replicas (asked through the proxy until both have answered: an idle
    replica is always the one asked, so call this while they are idle)."""
    counts: dict[str, float] = {}
    for _ in range(200):
        response = httpx.get(f"{url}/metrics", timeout=10)
        counts[replica_of(response)] = sum(
            float(line.rsplit(" ", 1)[1]) for line in response.text.splitlines()
            if line.startswith("streamvox_requests_total{") and f'route="{route}"' in line
            and f'status="{status}"' in line)
        if len(counts) == 2:
            return sum(counts.values())
    raise AssertionError(f"only {sorted(counts)} answered")


def test_client_disconnect_header_leaves_no_orphan(replicas):
    """`x-request-disconnect-disabled` never reaches Serve: when the client of a whole-file request (whose route
    reads nothing more from its client) leaves, Serve cancels the request instead of finishing it for nobody."""
    ok_before = _requests_total(replicas.url, "speech", "ok")
    sock = socket.create_connection(("127.0.0.1", replicas.port))
    # ~16 minutes of audio as mp3: ~8 s of work here (~2 s of synthesis, then the encoding).
    body = json.dumps({"input": (MINUTE_TEXT * 4)[:4096], "speed": 0.25, "response_format": "mp3"}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"x-request-disconnect-disabled: ?1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(1.0)
    sock.close()
    time.sleep(12)  # an orphan would have finished by now, and counted as "ok"
    assert _requests_total(replicas.url, "speech", "ok") == ok_before, "the disconnected client's request went on"


def test_no_default_request_timeout(replicas):
    import ray

    proxies = [a for a in ray.util.list_named_actors(all_namespaces=True) if "PROXY" in a["name"]]
    assert proxies
    for actor in proxies:
        options = ray.get(ray.get_actor(actor["name"], namespace=actor["namespace"])._get_http_options.remote())
        assert options.request_timeout_s is None


def test_health_follows_the_engine_through_its_restart(replicas):
    """An engine core that dies is restarted by the replica itself: Serve keeps the replica."""
    before = health_by_replica(replicas.url, 2)
    name, health = next(iter(before.items()))
    replica_pid = parent_pid(health["engine_pid"])
    os.kill(health["engine_pid"], signal.SIGKILL)
    after = health_by_replica(replicas.url, 2, accept=lambda seen: seen.get(name, {}).get("engine_restarts") == 1)
    time.sleep(3 * replicas.options().health_check_period_s)  # several health checks later
    after = health_by_replica(replicas.url, 2)
    assert set(after) == set(before) and after[name]["engine_restarts"] == 1 and is_running(replica_pid)
    assert httpx.get(f"{replicas.url}/-/healthz", timeout=10).status_code == 200


async def _slow_http(url: str, body: dict, result: dict, rate: float, headers: dict | None = None) -> None:
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_RCVBUF)])
    async with httpx.AsyncClient(transport=transport, timeout=120, headers=headers) as client:
        try:
            async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
                result["replica"] = replica_of(response)
                parts = result["parts"] = []
                async for part in response.aiter_raw():
                    parts.append(part)
                    await asyncio.sleep(len(part) / rate)
        except httpx.HTTPError as exc:
            result["error"] = exc
    result["body"] = b"".join(result.get("parts", []))


async def _slow_ws(ws_url: str, text: str, result: dict, rate: float) -> None:
    async with websockets.connect(f"{ws_url}/v1/audio/speech/stream", max_queue=1, max_size=None) as ws:
        ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_RCVBUF)
        result["replica"] = ws.response.headers["x-streamvox-replica"]
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        pcm = bytearray()
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    pcm += message
                    await asyncio.sleep(len(message) / rate)
                elif json.loads(message)["type"] == "audio.done":
                    result["done"] = True
                    break
        except websockets.ConnectionClosed as closed:
            result["closed"] = closed.rcvd.code if closed.rcvd else None
        result["pcm"] = bytes(pcm)


SSE = {"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"}
AUDIO = {"input": LONG_TEXT, "response_format": "pcm", "stream_format": "audio", "voice": "onyx"}


async def _traffic(cluster, during, rate: float = READ_BYTES_PER_S) -> list[dict]:
    """SSE, audio and text-stream WebSocket streams read at `rate` bytes/s; `during(results)` runs (in a thread)
    once they have all started."""
    results = [{"kind": kind} for kind in ("sse", "sse", "sse", "audio", "audio", "ws", "ws", "ws")]
    jobs = []
    for result in results:
        if result["kind"] == "ws":
            jobs.append(asyncio.ensure_future(_slow_ws(cluster.ws_url, LONG_TEXT, result, rate)))
        else:
            body = SSE if result["kind"] == "sse" else AUDIO
            jobs.append(asyncio.ensure_future(_slow_http(cluster.url, body, result, rate)))
        await asyncio.sleep(0.3)  # Serve's router sees each replica's load before it places the next one
    while not all("replica" in r for r in results):
        for job in jobs:
            if job.done():
                job.result()  # a stream that failed before it started
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(during, results)
    await asyncio.gather(*jobs)
    return results


def _solo(cluster) -> dict[str, bytes]:
    return {"sse": sse_pcm(parse_sse(speech(cluster.url, **SSE).content)),
            "audio": speech(cluster.url, **AUDIO).content,
            "ws": speech(cluster.url, input=LONG_TEXT, response_format="pcm").content}


def _completed_audio(result: dict) -> bytes | None:
    """The stream's audio if it ended normally, else None."""
    if result["kind"] == "ws":
        return result["pcm"] if result.get("done") else None
    if "error" in result:
        return None
    if result["kind"] == "sse":
        events = parse_sse(result["body"])
        return sse_pcm(events) if events and events[-1]["type"] == "speech.audio.done" else None
    return result["body"]


def test_a_killed_replica_is_replaced_and_the_other_streams_are_untouched(replicas):
    solo = _solo(replicas)
    before = health_by_replica(replicas.url, 2)
    killed: dict = {}

    def kill(results):
        victim = results[0]["replica"]
        killed["name"], killed["engine_pid"] = victim, before[victim]["engine_pid"]
        killed["pid"] = parent_pid(killed["engine_pid"])
        killed["at"] = time.monotonic()
        os.kill(killed["pid"], signal.SIGKILL)

    results = asyncio.run(_traffic(replicas, kill))
    on_victim = [r for r in results if r["replica"] == killed["name"]]
    others = [r for r in results if r["replica"] != killed["name"]]
    assert on_victim and others, [r["replica"] for r in results]
    for result in others:
        assert _completed_audio(result) == solo[result["kind"]], result["kind"]
    for result in on_victim:
        assert _completed_audio(result) is None, result["kind"]
        if result["kind"] == "sse":
            last = parse_sse(result["body"])[-1]
            assert last["type"] == "error" and last["error"]["code"] == "replica_unavailable", last
        elif result["kind"] == "ws":
            assert result["closed"] == 1011
    seen = health_by_replica(replicas.url, 2, timeout=60, accept=lambda seen: len(set(seen) - set(before)) >= 1)
    assert time.monotonic() - killed["at"] < 30, "the killed replica was not replaced within 30 s"
    assert killed["name"] not in seen or len(seen) > 2
    deadline = time.monotonic() + 15
    while is_running(killed["engine_pid"]):
        assert time.monotonic() < deadline, "the killed replica's engine core was not reaped"
        time.sleep(0.2)


def test_a_rolling_update_lets_in_flight_streams_finish(replicas):
    """Redeploying (here from 2 replicas to 1) is a rolling update: with a surge allowed, new requests go to the new
    replica while the old ones, routed around, finish their streams (graceful_shutdown_timeout_s), then stop."""
    solo = _solo(replicas)
    before = health_by_replica(replicas.url, 2)
    old_pids = [parent_pid(health["engine_pid"]) for health in before.values()]
    seen: dict = {}

    def update(results):
        rollout = threading.Thread(target=replicas.deploy, args=(replicas.settings,), kwargs={
            "replicas": 1, "max_streams": 8, "max_queued": 8, "graceful_shutdown_timeout_s": 60,
            "max_surge_percent": 100})
        rollout.start()
        health_by_replica(replicas.url, 1, timeout=120, accept=lambda now: bool(set(now) - set(before)))
        time.sleep(2)  # the new replica is up: Serve stops the old ones, which take no new requests
        seen["in_flight"] = sum("body" not in r and "pcm" not in r for r in results)
        seen["during"] = {replica_of(speech(replicas.url, input=TEXT)) for _ in range(4)}
        rollout.join(180)

    results = asyncio.run(_traffic(replicas, update, rate=500_000))
    assert seen["in_flight"] > 0, "every stream ended before the update did: nothing was left to drain"
    assert {r["replica"] for r in results} == set(before)
    for result in results:
        assert _completed_audio(result) == solo[result["kind"]], result["kind"]
    after = health_by_replica(replicas.url, 1)
    assert len(after) == 1 and seen["during"] == set(after) and not set(after) & set(before)
    deadline = time.monotonic() + 60
    while any(is_running(pid) for pid in old_pids):
        assert time.monotonic() < deadline, "an old replica did not stop"
        time.sleep(0.5)

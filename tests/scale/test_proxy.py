"""StreamVox's middleware in Serve's proxy: as ASGI against stand-ins for Serve, then overload on a real cluster."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets
import websockets.sync.client as ws_sync

from streamvox.scale import proxy
from streamvox.scale.flow import ACK, ACK_STEP_BYTES, FLOW_HEADER
from streamvox.scale.proxy import PROBE_PATH, ProxyMiddleware
from streamvox.server.app import ServerSettings
from tests.helpers.ray_serve import serve_cluster

REPLICA = (b"x-streamvox-replica", b"r1")
BACKPRESSURE = b"Request dropped due to backpressure (num_queued_requests=1, max_queued_requests=1)."


def http_scope(path: str = "/v1/audio/speech", headers=()) -> dict:
    return {"type": "http", "method": "POST", "path": path, "headers": list(headers)}


def ws_scope(extensions=True) -> dict:
    return {"type": "websocket", "path": "/v1/realtime", "headers": [],
            "extensions": {"websocket.http.response": {}} if extensions else {}}


def run(app, scope, incoming=({"type": "http.request", "body": b"", "more_body": False},)) -> list[dict]:
    """Drive `ProxyMiddleware(app)` once; what it sent to the client."""
    sent: list[dict] = []
    queue: asyncio.Queue = asyncio.Queue()

    async def receive():
        return await queue.get()

    async def send(message):
        sent.append(message)

    async def main():
        for message in incoming:
            queue.put_nowait(message)
        await ProxyMiddleware(app)(scope, receive, send)

    asyncio.run(main())
    return sent


def body_of(sent: list[dict]) -> dict:
    return json.loads(b"".join(m.get("body", b"") for m in sent if m["type"].endswith("response.body")))


def serve_refusal(status=503, text=BACKPRESSURE):
    """What Serve's proxy sends when its queue is full: plain text, on HTTP and WebSocket scopes alike."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": text})
    return app


def test_client_control_headers_are_dropped_and_flow_is_offered():
    seen = {}

    async def app(scope, receive, send):
        seen["headers"] = scope["headers"]
        await send({"type": "http.response.start", "status": 200, "headers": [REPLICA]})
        await send({"type": "http.response.body", "body": b"ok"})

    run(app, http_scope(headers=[(b"x-request-timeout-seconds", b"0.1"), (b"x-request-disconnect-disabled", b"?1"),
                                 (FLOW_HEADER, b"forged"), (b"authorization", b"Bearer k")]))
    assert seen["headers"] == [(b"authorization", b"Bearer k"), (FLOW_HEADER, b"1")]


def test_serves_own_http_refusal_becomes_an_openai_error():
    sent = run(serve_refusal(), http_scope())
    start = sent[0]
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert (b"content-type", b"application/json") in start["headers"]
    error = body_of(sent)["error"]
    assert error["code"] == "server_overloaded" and error["type"] == "server_error"
    assert "max_queued_requests=1" in error["message"]
    sent = run(serve_refusal(429), http_scope())
    assert sent[0]["status"] == 429 and body_of(sent)["error"]["type"] == "rate_limit_error"
    sent = run(serve_refusal(503, b"Deployment StreamVox is unavailable."), http_scope())
    assert sent[0]["status"] == 503 and body_of(sent)["error"]["code"] == "replica_unavailable"


def test_serves_own_websocket_refusal_becomes_a_denial_response_not_a_500():
    sent = run(serve_refusal(), ws_scope(), incoming=({"type": "websocket.connect"},))
    assert [m["type"] for m in sent] == ["websocket.http.response.start", "websocket.http.response.body"]
    assert sent[0]["status"] == 503 and body_of(sent)["error"]["code"] == "server_overloaded"
    sent = run(serve_refusal(), ws_scope(extensions=False), incoming=({"type": "websocket.connect"},))
    assert sent == [{"type": "websocket.close", "code": 1013, "reason": sent[0]["reason"]}]


def test_a_replicas_own_errors_pass_untouched():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 400, "headers": [REPLICA]})
        await send({"type": "http.response.body", "body": b'{"error": {"code": "invalid_value"}}'})

    sent = run(app, http_scope())
    assert sent[0]["status"] == 400 and body_of(sent) == {"error": {"code": "invalid_value"}}


def test_a_request_its_replica_never_answered_gets_a_503():
    async def app(scope, receive, send):
        raise RuntimeError("the replica died")

    sent = run(app, http_scope())
    assert sent[0]["status"] == 503 and body_of(sent)["error"]["code"] == "replica_unavailable"


def test_an_unfinished_event_stream_ends_with_an_error_event():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), REPLICA]})
        await send({"type": "http.response.body", "body": b'data: {"type":"speech.audio.delta"}\n\n',
                    "more_body": True})

    sent = run(app, http_scope())
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last.get("more_body")
    event = json.loads(last["body"].decode().removeprefix("data: "))
    assert event["type"] == "error" and event["error"]["code"] == "replica_unavailable"


def test_a_session_its_replica_dropped_is_closed_with_1011():
    async def app(scope, receive, send):
        await send({"type": "websocket.accept", "headers": [REPLICA]})

    sent = run(app, ws_scope(), incoming=({"type": "websocket.connect"},))
    assert sent[-1]["type"] == "websocket.close" and sent[-1]["code"] == 1011


def test_a_handshake_left_in_the_queue_is_refused(monkeypatch):
    monkeypatch.setattr(proxy, "WEBSOCKET_QUEUE_TIMEOUT_S", 0.2)
    cancelled = []

    async def app(scope, receive, send):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    started = time.monotonic()
    sent = run(app, ws_scope(), incoming=({"type": "websocket.connect"},))
    assert time.monotonic() - started < 5 and cancelled
    assert sent[0]["status"] == 503 and body_of(sent)["error"]["code"] == "server_overloaded"


def test_probe_is_answered_by_the_middleware():
    async def app(scope, receive, send):
        raise AssertionError("the probe reached Serve")

    sent = run(app, http_scope(PROBE_PATH))
    assert sent[0]["status"] == 200 and body_of(sent) == {"proxy": "streamvox"}


def test_delivered_bytes_are_acked_through_the_receive_channel():
    acks = []
    half = ACK_STEP_BYTES // 2

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [REPLICA]})
        for chunks in (3, 1, 2):
            for _ in range(chunks):
                await send({"type": "http.response.body", "body": b"x" * half, "more_body": True})
            acks.append(await receive())  # an ack when one is due goes before the client's own messages
        await send({"type": "http.response.body", "body": b""})

    run(app, http_scope())
    assert acks[0] == {"type": ACK, "delivered": 3 * half}
    assert acks[1] == {"type": "http.request", "body": b"", "more_body": False}  # 1 more chunk: no ack yet
    assert acks[2] == {"type": ACK, "delivered": 6 * half}


KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def one_slot(request, tmp_path_factory):
    """One replica with an API key that takes one stream, with one place in the proxy's queue."""
    cluster = serve_cluster(request)
    cluster.deploy(ServerSettings(api_key=KEY, voices_dir=str(tmp_path_factory.mktemp("voices"))), replicas=1,
                   max_streams=1, max_queued=1)
    yield cluster
    cluster.delete()


def test_api_key_through_the_proxy_header_and_browser_subprotocol(one_slot):
    refused = httpx.post(f"{one_slot.url}/v1/audio/speech", json={"input": "Hello."}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    url = f"{one_slot.ws_url}/v1/realtime?model=espeak"
    for kwargs in ({}, {"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]}):
        with pytest.raises(ws_sync.InvalidStatus) as info:
            ws_sync.connect(url, open_timeout=10, **kwargs)
        assert info.value.response.status_code == 403, kwargs
    with ws_sync.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"], open_timeout=10) as ws:
        assert ws.subprotocol == "realtime" and ws.response.headers["x-streamvox-replica"]
        assert '"session.created"' in ws.recv(10)


def _overloaded(status: int, headers, body: bytes) -> None:
    assert status == 503, (status, body)
    assert headers["retry-after"] == "1"
    error = json.loads(body)["error"]
    assert error["code"] == "server_overloaded" and error["type"] == "server_error", error


def test_overload_is_refused_in_protocol_never_a_500(one_slot):
    asyncio.run(_overload(one_slot))


async def _overload(cluster) -> None:
    stream_url = f"{cluster.ws_url}/v1/audio/speech/stream"
    # The replica's one slot, for as long as the session lasts.
    holder = await websockets.connect(stream_url, additional_headers=AUTH)
    try:
        started = time.monotonic()
        queued = asyncio.ensure_future(websockets.connect(stream_url, additional_headers=AUTH, open_timeout=30))
        await asyncio.sleep(1.0)  # it waits in the proxy's queue, which has one place
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{cluster.url}/v1/audio/speech", json={"input": "Hello."}, headers=AUTH)
        _overloaded(response.status_code, response.headers, response.content)
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(stream_url, additional_headers=AUTH, open_timeout=30)
        denial = refused.value.response
        _overloaded(denial.status_code, denial.headers, denial.body)
        with pytest.raises(websockets.InvalidStatus) as timed_out:
            await queued
        denial = timed_out.value.response
        _overloaded(denial.status_code, denial.headers, denial.body)
        waited = time.monotonic() - started
        assert proxy.WEBSOCKET_QUEUE_TIMEOUT_S - 1 < waited < proxy.WEBSOCKET_QUEUE_TIMEOUT_S + 10, waited
    finally:
        await holder.close()
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{cluster.url}/v1/audio/speech", json={"input": "Hello."}, headers=AUTH)
        assert response.status_code == 200

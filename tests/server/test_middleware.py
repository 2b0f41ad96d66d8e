"""`x-request-id` on every response (errors, streams and WebSocket handshakes included) and in the log lines."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient
from websockets.sync import client as ws_client

from streamvox.server.errors import ERROR_HANDLERS
from streamvox.server.middleware import RequestIdMiddleware, current_request_id, engine_request_id
from tests.helpers.server import Server, free_port

KEY = "request-id-key"
MINTED = re.compile(r"req_[0-9a-f]{32}")
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def logged_server(tmp_path_factory):
    """A keyed server at --log-level info, its stdout and stderr (uvicorn's access log is on stdout) in a file."""
    log_path = tmp_path_factory.mktemp("log") / "server.log"
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port),
                                    "--log-level", "info", "--api-key", KEY], stdout=log, stderr=subprocess.STDOUT)
    server = Server(process, port, KEY)
    try:
        server.wait_healthy()
        yield server, log_path
    finally:
        server.stop()


def _id(response: httpx.Response) -> str:
    return response.headers["x-request-id"]


def test_every_http_response_carries_a_request_id(logged_server):
    server, _ = logged_server
    speech = {"input": "Hello there.", "response_format": "pcm"}
    responses = [
        httpx.get(f"{server.url}/health"),
        httpx.get(f"{server.url}/v1/models", headers=AUTH),
        httpx.get(f"{server.url}/v1/models"),  # 401
        httpx.get(f"{server.url}/no/such/route", headers=AUTH),  # 404
        httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, json={"input": ""}),  # 400
        httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, json=speech, timeout=30),
        httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, json={**speech, "stream_format": "sse"}, timeout=30),
        httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, json={**speech, "stream_format": "audio"},
                   timeout=30),
        httpx.post(f"{server.url}/v1/audio/speech/batch", headers=AUTH, json={"items": [speech, speech]}, timeout=30),
    ]
    assert [r.status_code for r in responses] == [200, 200, 401, 404, 400, 200, 200, 200, 200]
    ids = [_id(r) for r in responses]
    assert all(MINTED.fullmatch(i) for i in ids) and len(set(ids)) == len(ids), ids


def test_a_client_request_id_is_echoed_when_usable(logged_server):
    server, _ = logged_server
    for sent in ("client-id-1", "7f9c1f5e-3a5b-4c1d-9e2f-0a1b2c3d4e5f", "x" * 128):
        assert _id(httpx.get(f"{server.url}/v1/models", headers={**AUTH, "x-request-id": sent})) == sent
    for unusable in ("two words", "x" * 129, "caf\u00e9", ""):
        response = httpx.get(f"{server.url}/v1/models", headers={**AUTH, "x-request-id": unusable.encode()})
        assert MINTED.fullmatch(_id(response)), unusable
    stream = httpx.post(f"{server.url}/v1/audio/speech", headers={**AUTH, "x-request-id": "stream-id-2"},
                        json={"input": "Hi.", "stream_format": "sse", "response_format": "pcm"}, timeout=30)
    assert stream.status_code == 200 and _id(stream) == "stream-id-2"


def test_websocket_handshakes_carry_the_request_id(logged_server):
    server, _ = logged_server
    for path in ("/v1/realtime?model=espeak", "/v1/audio/speech/stream"):
        with ws_client.connect(server.ws_url + path, additional_headers={**AUTH, "x-request-id": "ws-id-3"},
                               open_timeout=10) as ws:
            assert ws.response.headers["x-request-id"] == "ws-id-3"
        with ws_client.connect(server.ws_url + path, additional_headers=AUTH, open_timeout=10) as ws:
            assert MINTED.fullmatch(ws.response.headers["x-request-id"])


def test_log_lines_of_a_request_carry_its_id(logged_server):
    server, log_path = logged_server
    httpx.post(f"{server.url}/v1/audio/speech", headers={**AUTH, "x-request-id": "logged-id-4"},
               json={"input": "Logged."}, timeout=30)
    httpx.get(f"{server.url}/v1/models", headers={"x-request-id": "refused-id-5"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = log_path.read_text()
        if "[logged-id-4]" in text and "[refused-id-5]" in text:
            break
        time.sleep(0.1)
    lines = log_path.read_text().splitlines()
    assert any("[logged-id-4]" in line and "POST /v1/audio/speech" in line and "200" in line for line in lines), lines
    assert any("[refused-id-5]" in line and "401" in line for line in lines), lines


def test_server_errors_carry_the_request_id_and_the_id_reaches_engine_requests():
    seen = {}

    async def boom(request):
        seen["id"] = current_request_id()
        seen["engine"] = engine_request_id("speech")
        raise RuntimeError("a bug")

    app = RequestIdMiddleware(Starlette(routes=[Route("/boom", boom)], exception_handlers=ERROR_HANDLERS))
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom", headers={"x-request-id": "bug-id-6"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "bug-id-6"
    assert response.json()["error"]["code"] == "internal_error"
    assert seen["id"] == "bug-id-6" and re.fullmatch(r"speech_[0-9a-f]{12}_bug-id-6", seen["engine"])
    assert current_request_id() is None and re.fullmatch(r"speech_[0-9a-f]{32}", engine_request_id("speech"))

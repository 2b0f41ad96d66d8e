"""Security: API key on every route, WebSocket Origin policy, where `ref_audio` may come from, voice names.

Every network address used here is loopback: a tiny local HTTP server serves
the reference audio. Addresses that must be refused are refused before any
connection is made (and the unit tests of the address check touch no network).
"""

from __future__ import annotations

import base64
import io
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import soundfile
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from streamvox.server.errors import APIError
from streamvox.server.media_fetch import _public
from streamvox.server.routes.voices import sanitize_voice_name
from tests.helpers.server import start_server

KEY = "sk-test-0123456789"
SPEECH = {"input": "Hello there.", "response_format": "pcm"}


def wav_bytes(seconds: float = 0.5, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def flac_claiming(seconds: float, rate: int = 48000) -> bytes:
    """A FLAC file of 0.5 s whose STREAMINFO block says it holds `seconds`."""
    buffer = io.BytesIO()
    t = np.arange(rate // 2) / rate
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="FLAC")
    data = bytearray(buffer.getvalue())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    # STREAMINFO: 10 bytes of block and frame sizes, then 64 bits: rate (20), channels (3), bits (5), samples (36)
    field = int.from_bytes(data[18:26], "big")
    field = (field & ~((1 << 36) - 1)) | int(seconds * rate)
    data[18:26] = field.to_bytes(8, "big")
    return bytes(data)


# --- API key -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server():
    server = start_server(api_key=KEY)
    yield server
    server.stop()


HTTP_ROUTES = [
    ("GET", "/v1/models", None), ("GET", "/v1/audio/voices", None),
    ("GET", "/metrics", None), ("POST", "/v1/audio/speech", SPEECH),
    ("POST", "/v1/audio/speech", {**SPEECH, "stream_format": "sse"}),
    ("POST", "/v1/audio/speech", {**SPEECH, "stream_format": "audio"}),
    ("POST", "/v1/audio/speech/batch", {"items": [SPEECH]}), ("GET", "/no/such/route", None),
    ("GET", "/no/health", None), ("GET", "/health/no", None),
]


@pytest.mark.parametrize("method,path,body", HTTP_ROUTES)
def test_api_key_protects_every_http_route(keyed_server, method, path, body):
    url = keyed_server.url + path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": f"Bearer {KEY}x"}):
        response = httpx.request(method, url, json=body, headers=headers, timeout=30)
        assert response.status_code == 401, (path, headers, response.status_code)
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    response = httpx.request(method, url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert response.status_code == (404 if "/no" in path else 200), response.text[:200]


def test_health_stays_open_with_an_api_key_and_says_only_up_or_down(keyed_server):
    """Liveness probes (Kubernetes, load balancers) carry no key; the details still need one."""
    url = f"{keyed_server.url}/health"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(url, headers=headers, timeout=10)
        assert response.status_code == 200 and response.json() == {"status": "ok"}, response.text
    detailed = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert detailed["status"] == "ok" and detailed["model"] == "espeak" and "engine_pid" in detailed
    assert httpx.head(url, timeout=10).status_code == 200


@pytest.mark.parametrize("path", ["/v1/realtime?model=espeak", "/v1/audio/speech/stream"])
def test_api_key_protects_websockets_header_and_browser_subprotocol(keyed_server, path):
    url = keyed_server.ws_url + path
    refusals = [dict(), dict(additional_headers={"Authorization": "Bearer wrong"}),
                dict(subprotocols=["realtime", "openai-insecure-api-key.wrong"]),
                dict(subprotocols=["realtime"])]
    for kwargs in refusals:
        with pytest.raises(InvalidStatus) as info:
            ws_client.connect(url, open_timeout=10, **kwargs)
        assert info.value.response.status_code == 403, kwargs
    with ws_client.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=10) as ws:
        ws.send('{"type": "bogus"}')
        replies = [ws.recv(10) for _ in range(2 if path.startswith("/v1/realtime") else 1)]
        assert '"unknown_event_type"' in replies[-1]
    if path.startswith("/v1/realtime"):  # the browser form: the server echoes `realtime`
        with ws_client.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"],
                               open_timeout=10) as ws:
            assert ws.subprotocol == "realtime"
            assert '"session.created"' in ws.recv(10)


# --- WebSocket Origin -------------------------------------------------------------------------------


def ws_status(server, path: str, origin: str | None, **kwargs) -> int:
    headers = {**server.headers(), **({"Origin": origin} if origin is not None else {})}
    try:
        with ws_client.connect(server.ws_url + path, additional_headers=headers, open_timeout=10,
                               origin=None, **kwargs):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/audio/speech/stream"])
def test_origin_policy_default_allows_no_origin_and_same_host_only(espeak_server, path):
    server = espeak_server
    assert ws_status(server, path, None) == 101  # non-browser clients send no Origin
    assert ws_status(server, path, f"http://127.0.0.1:{server.port}") == 101  # a page this server served
    for origin in ("http://evil.example", f"http://127.0.0.1:{server.port + 1}", "null",
                   f"https://127.0.0.1.evil.example:{server.port}", "garbage"):
        assert ws_status(server, path, origin) == 403, origin


def test_allowed_origins_flag_and_origin_checked_before_key():
    server = start_server("--allowed-origins", "https://app.example, http://localhost:3000", api_key=KEY)
    try:
        for origin, expected in [("https://app.example", 101), ("http://localhost:3000", 101),
                                 ("https://APP.example:443", 101), ("https://other.example", 403),
                                 (f"http://127.0.0.1:{server.port}", 101), (None, 101)]:
            assert ws_status(server, "/v1/audio/speech/stream", origin) == expected, origin
        # A foreign page holding the key is still refused; a listed origin without the key is too.
        assert ws_status(server, "/v1/realtime", "https://other.example") == 403
        with pytest.raises(InvalidStatus):
            ws_client.connect(server.ws_url + "/v1/realtime", additional_headers={"Origin": "https://app.example"},
                              open_timeout=10)
    finally:
        server.stop()


# --- ref_audio sources ------------------------------------------------------------------------------


class MediaServer:
    """A loopback HTTP server: /ref.wav, /big (too large), /slow (too slow), /redirect, /text."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        owner = self
        wav = wav_bytes()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.hits.append(self.path)
                if self.path == "/ref.wav":
                    self._send(200, wav)
                elif self.path == "/text":
                    self._send(200, b"not audio at all")
                elif self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", "/ref.wav")
                    self.end_headers()
                elif self.path == "/big":  # chunked, no length: the cap must stop the read
                    self.send_response(200)
                    self.end_headers()
                    try:
                        for _ in range(12 * 16):
                            self.wfile.write(b"\0" * 65536)
                    except OSError:
                        pass
                elif self.path == "/drip-headers":  # a header line at a time: each read is quick, the whole is not
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        for i in range(30):
                            self.wfile.write(b"X-Drip: %d\r\n" % i)
                            self.wfile.flush()
                            time.sleep(0.3)
                    except OSError:
                        pass
                elif self.path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(wav)))
                    self.end_headers()
                    try:
                        for i in range(0, len(wav), 1000):
                            self.wfile.write(wav[i:i + 1000])
                            self.wfile.flush()
                            time.sleep(0.5)
                    except OSError:
                        pass
                else:
                    self._send(404, b"")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def media():
    server = MediaServer()
    yield server
    server.close()


def speak(server, ref_audio: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", json={**SPEECH, "ref_audio": ref_audio},
                      headers=server.headers(), timeout=60)


def error_code(response: httpx.Response) -> str:
    assert response.status_code == 400, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["param"] == "ref_audio"
    return error["code"]


def test_ref_audio_urls_refused_by_default(espeak_server, media):
    for url in (media.url("/ref.wav"), "https://127.0.0.1:1/x.wav", "file:///etc/passwd", "FILE:///etc/passwd"):
        assert error_code(speak(espeak_server, url)) == "ref_audio_forbidden", url
    assert media.hits == []


def test_ref_audio_urls_never_reach_private_addresses_without_the_second_flag(media):
    server = start_server("--allow-ref-audio-urls")
    try:
        before = len(media.hits)
        for url in (media.url("/ref.wav"), media.url("/ref.wav", "localhost"), media.url("/ref.wav", "[::1]"),
                    media.url("/ref.wav", "127.1"), media.url("/ref.wav", "0x7f000001"),
                    media.url("/ref.wav", "[::ffff:127.0.0.1]")):
            response = speak(server, url)
            assert error_code(response) in ("ref_audio_forbidden", "ref_audio_unreachable"), url
        assert len(media.hits) == before, "a refused URL was fetched"
        assert error_code(speak(server, "ftp://127.0.0.1/x")) == "invalid_value"  # not http(s)
        assert error_code(speak(server, "file:///etc/passwd")) == "ref_audio_forbidden"  # needs its own flag
    finally:
        server.stop()


def test_ref_audio_url_fetch_with_private_allowed_caps_bytes_time_and_redirects(media):
    server = start_server("--allow-ref-audio-urls", "--allow-private-ref-audio-urls",
                          "--ref-audio-fetch-timeout-s", "1.5")
    try:
        # fetched and decoded, then refused by a model that cannot clone (eSpeak): the rules hold for every model
        assert error_code(speak(server, media.url("/ref.wav"))) == "voice_cloning_unsupported"
        assert "/ref.wav" in media.hits
        assert speak(server, media.url("/text")).json()["error"]["message"].startswith("'ref_audio' could not be")
        assert error_code(speak(server, media.url("/redirect"))) == "ref_audio_fetch_failed"
        assert error_code(speak(server, media.url("/missing"))) == "ref_audio_fetch_failed"
        assert error_code(speak(server, media.url("/big"))) == "ref_audio_too_large"
        # A slow fetch times out, and the event loop keeps serving meanwhile.
        result = {}
        slow = threading.Thread(target=lambda: result.setdefault("r", speak(server, media.url("/slow"))))
        started = time.monotonic()
        slow.start()
        time.sleep(0.3)
        health_s = time.monotonic()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        health_s = time.monotonic() - health_s
        slow.join(30)
        assert error_code(result["r"]) == "ref_audio_timeout"
        assert time.monotonic() - started < 5
        assert health_s < 0.5, f"/health took {health_s:.2f} s during a fetch: the loop was blocked"
        # The time cap holds while the headers are still coming (it took the 9 s of the drip).
        started = time.monotonic()
        assert error_code(speak(server, media.url("/drip-headers"))) == "ref_audio_timeout"
        assert time.monotonic() - started < 5
    finally:
        server.stop()


def test_ref_audio_file_urls_only_under_the_allowed_directory(tmp_path):
    media_dir = tmp_path / "media"
    media_dir.mkdir()
    (media_dir / "ref.wav").write_bytes(wav_bytes())
    outside = tmp_path / "outside.wav"
    outside.write_bytes(wav_bytes())
    (media_dir / "link.wav").symlink_to(outside)
    (media_dir / "sub").mkdir()
    (media_dir / "long.wav").write_bytes(wav_bytes(seconds=61, rate=8000))
    server = start_server("--allowed-local-media-path", str(media_dir))
    try:
        assert error_code(speak(server, f"file://{media_dir}/ref.wav")) == "voice_cloning_unsupported"  # read
        assert error_code(speak(server, f"file://{media_dir}/link.wav")) == "ref_audio_forbidden"  # symlink out
        assert error_code(speak(server, f"file://{media_dir}/../outside.wav")) == "ref_audio_forbidden"
        assert error_code(speak(server, f"file://{media_dir}/%2E%2E/outside.wav")) == "ref_audio_forbidden"
        assert error_code(speak(server, f"file://{outside}")) == "ref_audio_forbidden"
        assert error_code(speak(server, "file:///etc/passwd")) == "ref_audio_forbidden"
        assert error_code(speak(server, f"file://{media_dir}/nope.wav")) == "ref_audio_not_found"
        assert error_code(speak(server, f"file://{media_dir}/sub")) == "ref_audio_not_found"
        assert error_code(speak(server, f"file://otherhost{media_dir}/ref.wav")) == "invalid_value"
        long_error = speak(server, f"file://{media_dir}/long.wav").json()["error"]
        assert long_error["param"] == "ref_audio" and "longer than 60 s" in long_error["message"]
        # http(s) stays off: the file flag does not open URLs.
        assert error_code(speak(server, "http://127.0.0.1:1/x.wav")) == "ref_audio_forbidden"
    finally:
        server.stop()


def test_uploaded_ref_audio_capped_in_bytes_and_duration(espeak_server):
    too_long = base64.b64encode(wav_bytes(seconds=61, rate=8000)).decode()
    error = speak(espeak_server, too_long).json()["error"]
    assert error["param"] == "ref_audio" and "longer than 60 s" in error["message"]
    too_big = base64.b64encode(os.urandom(10 * 1024 * 1024 + 1)).decode()
    error = speak(espeak_server, too_big).json()["error"]
    assert error["param"] == "ref_audio" and "larger than" in error["message"]
    assert error["code"] == "ref_audio_too_large"
    # A file is refused by the length its header states, before it is decoded: this one says 4 hours (its
    # decoded samples would take 2.8 GB) and holds 0.5 s.
    error = speak(espeak_server, base64.b64encode(flac_claiming(4 * 3600)).decode()).json()["error"]
    assert error["param"] == "ref_audio" and "longer than 60 s" in error["message"], error
    decoded = speak(espeak_server, "data:audio/wav;base64," + base64.b64encode(wav_bytes()).decode())
    assert error_code(decoded) == "voice_cloning_unsupported"  # a data URI decodes; eSpeak cannot clone
    # The body cap holds for a chunked body without Content-Length, too.
    def chunks():
        for _ in range(17):
            yield b" " * (1024 * 1024)
    response = httpx.post(f"{espeak_server.url}/v1/audio/speech", content=chunks(), headers=espeak_server.headers(),
                          timeout=60)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


# --- unit checks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("address,public", [
    ("127.0.0.1", False), ("::1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("fe80::1", False), ("fc00::1", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("224.0.0.1", False), ("240.0.0.1", False),
    ("::", False), ("8.8.8.8", True), ("2606:4700::1111", True),
])
def test_address_classification(address, public):
    assert _public(address) is public


@pytest.mark.parametrize("name,ok", [
    ("alice", True), ("A_b-9", True), ("x" * 64, True), ("x" * 65, False), ("", False), ("../etc", False),
    ("a/b", False), ("a b", False), ("é", False), ("a\n", False), ("a.wav", False), ("NUL\0", False), (None, False),
    (7, False),
])
def test_voice_name_sanitiser(name, ok):
    if ok:
        assert sanitize_voice_name(name) == name
    else:
        with pytest.raises(APIError) as info:
            sanitize_voice_name(name)
        assert info.value.status == 400 and info.value.code == "invalid_voice_name"

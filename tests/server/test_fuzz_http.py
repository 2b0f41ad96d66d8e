"""Property-based fuzzing of every HTTP route against a real server, with a good stream running alongside.

Properties: the server never crashes and never answers 500; every error is
OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with a
documented status; every 200 is well-formed for its mode; and a concurrent
good SSE stream stays byte-identical to its solo run the whole time.
Example counts are bounded (`FUZZ_EXAMPLES`) to keep CI fast.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.audio import parse_sse, sse_pcm

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
SEEN: Counter = Counter()  # what the fuzzers actually ran: (test, outcome) -> count
DOCUMENTED_ERRORS = {400, 404, 405, 413}
GOOD = {"input": "A steady voice keeps speaking while the fuzzer runs.", "response_format": "pcm",
        "stream_format": "sse", "voice": "alloy"}
FIELDS = ["model", "input", "voice", "instructions", "response_format", "speed", "stream_format", "stream",
          "sample_rate", "language", "task_type", "ref_audio", "ref_text", "max_new_tokens", "seed",
          "initial_codec_chunk_frames", "temperature", "top_k", "top_p", "repetition_penalty"]
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=False), st.text(max_size=30),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
plausible = {
    "model": st.sampled_from(["espeak", "tts-1", "gpt-4o-mini-tts", "nope", ""]),
    "input": st.one_of(st.text(min_size=0, max_size=40), st.just("x" * 4097), st.just("Hello there.")),
    "voice": st.one_of(st.sampled_from(["alloy", "nova", "en-us", "../../etc/passwd", ""]),
                       st.fixed_dictionaries({"id": st.sampled_from(["alloy", "bogus"])})),
    "response_format": st.sampled_from(["wav", "pcm", "flac", "mp3", "opus", "aac", "ogg", ""]),
    "speed": st.one_of(st.floats(0.1, 5.0), st.sampled_from([0.25, 1, 4.0])),
    "stream_format": st.sampled_from(["sse", "audio", "video", None]),
    "stream": st.booleans(),
    "sample_rate": st.sampled_from([7999, 8000, 16000, 22050, 24000, 44100, 48000, 48001]),
    "ref_audio": st.sampled_from(["", "!!!", "data:audio/wav;base64,AAAA", "http://127.0.0.1:1/x.wav",
                                  "file:///etc/passwd", "UklGRg=="]),
    "seed": st.integers(-5, 2**64),
}
# JSON integers are unbounded: a huge one must be a 400, not an overflow.
numbers = st.one_of(st.integers(-10, 10**6), st.floats(-1e6, 1e6), st.integers(10**300, 10**400),
                    st.sampled_from([2**63, -(2**63) - 1, 1e308]))
for _key in ("speed", "sample_rate", "temperature", "top_k", "top_p", "max_new_tokens", "initial_codec_chunk_frames",
             "repetition_penalty"):
    plausible[_key] = plausible[_key] | numbers if _key in plausible else numbers


@st.composite
def speech_bodies(draw) -> object:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(json_values)  # anything at all
    keys = draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True))
    body = {"input": draw(st.text(min_size=1, max_size=30))} if kind < 8 else {}
    mostly_valid = kind in (1, 2, 3)  # plausible values only: many succeed, so the success paths are fuzzed too
    for key in keys:
        strategy = plausible.get(key, json_values)
        body[key] = draw(strategy if mostly_valid or draw(st.booleans()) else json_values)
    if kind == 9:
        body[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return body


class GoodStreamer(threading.Thread):
    """Streams GOOD over and over until stopped; records every result."""

    def __init__(self, url: str, headers: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.stop = threading.Event()
        self.results: list[bytes | str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with httpx.stream("POST", f"{self.url}/v1/audio/speech", json=GOOD, headers=self.headers,
                                  timeout=60) as response:
                    events = parse_sse(response.read())
                if events[-1]["type"] != "speech.audio.done":
                    self.results.append(f"ended with {events[-1]}")
                else:
                    self.results.append(sse_pcm(events))
            except Exception as exc:  # noqa: BLE001 - recorded and asserted on
                self.results.append(f"{type(exc).__name__}: {exc}")


def solo_pcm(server) -> bytes:
    response = httpx.post(f"{server.url}/v1/audio/speech", json=GOOD, headers=server.headers(), timeout=60)
    return sse_pcm(parse_sse(response.content))


def check_error_shape(response: httpx.Response) -> None:
    assert response.status_code in DOCUMENTED_ERRORS, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] is None or isinstance(error["param"], str)


def check_speech_response(response: httpx.Response, body: object) -> None:
    if response.status_code != 200:
        check_error_shape(response)
        return
    assert isinstance(body, dict)
    content_type = response.headers["content-type"]
    if content_type.startswith("text/event-stream"):
        events = parse_sse(response.content)
        kinds = [e["type"] for e in events]
        assert kinds and kinds[-1] in ("speech.audio.done", "error") and kinds.count(kinds[-1]) == 1, kinds[-3:]
        assert set(kinds[:-1]) <= {"speech.audio.delta"}
    else:
        assert content_type.startswith("audio/"), content_type


def run_with_good_stream(server, check) -> None:
    solo = solo_pcm(server)
    assert len(solo) > 10000
    streamer = GoodStreamer(server.url, server.headers())
    streamer.start()
    try:
        check()
    finally:
        streamer.stop.set()
        streamer.join(60)
    assert server.process.poll() is None, "the server died"
    assert streamer.results, "the good stream never finished"
    bad = [r if isinstance(r, str) else f"{len(r)} bytes differ" for r in streamer.results if r != solo]
    assert not bad, f"{len(bad)}/{len(streamer.results)} good streams differed from solo: {bad[:3]}"


def test_fuzz_speech_bodies(espeak_server):
    server = espeak_server
    client = httpx.Client(base_url=server.url, headers=server.headers(), timeout=60)

    @FUZZ
    @given(body=speech_bodies())
    def check(body):
        try:
            content = json.dumps(body, allow_nan=True)
        except (ValueError, TypeError):
            return
        response = client.post("/v1/audio/speech", content=content, headers={"content-type": "application/json"})
        SEEN["speech", response.status_code] += 1
        check_speech_response(response, body)

    run_with_good_stream(server, check)
    print(sorted(SEEN.items()))
    assert SEEN["speech", 200] >= EXAMPLES // 10 and SEEN["speech", 400] >= EXAMPLES // 4, SEEN


def test_fuzz_batch_and_raw_bodies(espeak_server):
    server = espeak_server
    client = httpx.Client(base_url=server.url, headers=server.headers(), timeout=60)

    @FUZZ
    @given(items=st.one_of(st.lists(speech_bodies(), max_size=4), json_values),
           raw=st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=100).map(str.encode),
                         st.integers(1, 20000).map(lambda n: b"[" * n + b"]" * n)),
           route=st.sampled_from(["/v1/audio/speech", "/v1/audio/speech/batch"]))
    def check(items, raw, route):
        if raw is not None:
            response = client.post(route, content=raw)
            SEEN["raw", response.status_code] += 1
            if response.status_code != 200:
                check_error_shape(response)
            return
        try:
            content = json.dumps({"items": items})
        except (ValueError, TypeError):
            return
        response = client.post("/v1/audio/speech/batch", content=content)
        SEEN["batch", response.status_code] += 1
        if response.status_code != 200:
            check_error_shape(response)
            return
        data = response.json()["data"]
        assert [d["index"] for d in data] == list(range(len(items)))
        for item in data:
            if item["status"] == "failed":
                assert set(item["error"]) == {"message", "type", "param", "code"}
            else:
                assert item["status"] == "succeeded" and item["audio"]

    run_with_good_stream(server, check)
    assert SEEN["batch", 200] >= 5 and sum(n for (kind, _), n in SEEN.items() if kind == "raw") >= 5, SEEN


def test_fuzz_other_routes_methods_and_paths(espeak_server):
    server = espeak_server
    client = httpx.Client(base_url=server.url, headers=server.headers(), timeout=30)
    routes = ["/health", "/v1/models", "/v1/audio/voices", "/metrics", "/v1/audio/speech",
              "/v1/audio/speech/batch", "/v1/realtime", "/v1/audio/speech/stream"]

    @settings(FUZZ, max_examples=max(20, EXAMPLES // 3))
    @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
           path=st.one_of(st.sampled_from(routes), st.text(alphabet="abcdefv1/._-%", max_size=20).map("/".__add__)),
           query=st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5), st.text(max_size=10),
                                 max_size=3))
    def check(method, path, query):
        response = client.request(method, path, params=query)
        SEEN["routes", response.status_code] += 1
        assert response.status_code != 500 and response.status_code < 600, response.status_code
        if response.status_code >= 400 and method != "HEAD":
            check_error_shape(response)

    check()
    assert server.process.poll() is None
    assert sum(n for (kind, _), n in SEEN.items() if kind == "routes") >= 20, SEEN

"""Qwen3-TTS through a real `streamvox serve` with tiny checkpoints, and real clients (`openai` SDK, httpx).

CustomVoice: file / SSE / chunked audio agree, concurrent seeded requests equal their solo runs, bad
input is a clear 400 while another stream carries on. Base: the cloned-voice cycle (upload, list,
speak, engine restart, server restart, delete) and its errors.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import signal
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile

from benchmarks.build_tiny_qwen3 import build
from streamvox.models.qwen3_tts.openai_voices import OPENAI_VOICES
from tests.helpers.audio import parse_sse, sse_pcm
from tests.helpers.server import start_server

TEXT = "Hello world, this is streaming speech!"
GREEDY = {"temperature": 0, "max_new_tokens": 12, "initial_codec_chunk_frames": 2}


@pytest.fixture(scope="module")
def cv_server(tmp_path_factory):
    model = build(tmp_path_factory.mktemp("cv") / "tiny-cv", "custom_voice", seed=21)
    server = start_server("--model", str(model), "--max-batch", "8")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(cv_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cv_server.url}/v1", api_key="unused", timeout=300)


def _speech(server, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=timeout)


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return error


# ------------------------------------------------------------------------------------------- CustomVoice


def test_models_and_voices(cv_server):
    model = httpx.get(f"{cv_server.url}/v1/models").json()["data"][0]
    assert model["family"] == "qwen3_tts" and model["sample_rate"] == 24000
    voices = httpx.get(f"{cv_server.url}/v1/audio/voices").json()
    assert voices["voices"] == voices["builtin_voices"] == ["alice", "bob", "dylan", *OPENAI_VOICES]
    assert voices["custom_voices"] == [] and voices["voice_cloning"] is False


@pytest.mark.timeout(1200)  # the shared CI machine can be very slow
def test_sdk_file_sse_and_audio_stream_agree(client):
    kwargs = dict(model="tiny-cv", voice="alice", input=TEXT, extra_body={"language": "english", **GREEDY})
    wav = client.audio.speech.create(response_format="wav", **kwargs)
    samples, rate = soundfile.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 24000 and len(samples) > 0 and np.abs(samples).max() > 30  # not silence
    pcm = client.audio.speech.create(response_format="pcm", **kwargs).content
    # The wav file is quantised by libsndfile (floor(x * 32768)), pcm by our encoder (trunc(x * 32767)): the
    # same clip to within two steps.
    assert len(pcm) == 2 * len(samples)
    assert np.abs(np.frombuffer(pcm, "<i2").astype(int) - samples.astype(int)).max() <= 2

    with client.audio.speech.with_streaming_response.create(response_format="pcm", stream_format="sse",
                                                            **kwargs) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.read())
    kinds = [e["type"] for e in events]
    assert kinds.count("speech.audio.delta") >= 2, kinds  # streamed, not one clip
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.done") == 1
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert sse_pcm(events) == pcm  # the deltas concatenate to the non-streaming clip

    with client.audio.speech.with_streaming_response.create(response_format="pcm", stream_format="audio",
                                                            **kwargs) as response:
        chunks = [c for c in response.iter_bytes() if c]
    assert len(chunks) >= 2 and b"".join(chunks) == pcm


async def _stream(client: httpx.AsyncClient, body: dict) -> bytes:
    async with client.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio",
                                                              "response_format": "pcm"}) as response:
        assert response.status_code == 200, await response.aread()
        return b"".join([chunk async for chunk in response.aiter_bytes()])


@pytest.mark.timeout(1200)  # the shared CI machine can be very slow
def test_concurrent_seeded_requests_equal_their_solo_runs(cv_server):
    texts = ["Hello world.", "The quick brown fox jumps.", "Streaming text arrives word by word.",
             "Speak softly, please.", "Numbers like 12 and 345!", "Does it work? Yes: it does."]
    bodies = [{"input": texts[i], "voice": ("alice", "bob", "dylan")[i % 3], "seed": 1000 + i,
               "max_new_tokens": 10 + i, "initial_codec_chunk_frames": 3, "language": "english"}
              for i in range(len(texts))]

    async def run() -> tuple[list[bytes], list[bytes]]:
        async with httpx.AsyncClient(base_url=cv_server.url, timeout=300) as http:
            solo = [await _stream(http, body) for body in bodies]
            together = await asyncio.gather(*(_stream(http, body) for body in bodies))
        return solo, together

    solo, together = asyncio.run(run())
    assert all(len(s) > 0 for s in solo)
    assert len({s for s in solo}) == len(solo)  # distinct requests, distinct audio
    for i, (a, b) in enumerate(zip(solo, together, strict=True)):
        # Same frames (any sampled code that differed, or another request's state, would change the audio by
        # far more), decoded in batches of another size: float rounding may move a sample by a few steps.
        assert len(a) == len(b), f"request {i}: {len(a)} bytes solo, {len(b)} concurrent"
        diff = np.abs(np.frombuffer(a, "<i2").astype(int) - np.frombuffer(b, "<i2").astype(int))
        assert diff.max() <= 8, f"request {i}: concurrent output differs from its solo run by up to {diff.max()}"


@pytest.mark.timeout(1200)  # the shared CI machine can be very slow
def test_bad_input_is_a_400_while_another_stream_is_untouched(cv_server):
    long_body = {"input": TEXT, "voice": "bob", "language": "english", "temperature": 0, "max_new_tokens": 40,
                 "initial_codec_chunk_frames": 2}
    bad = [
        ({"input": TEXT, "voice": "zed"}, "voice"),
        ({"input": TEXT, "voice": "alice", "language": "klingon"}, "language"),
        ({"input": TEXT, "voice": "alice", "instructions": "x" * 5000}, "instructions"),  # over the char cap
        # Under the char cap but over the model's instruction-token cap: refused by the runner, still a 400.
        ({"input": TEXT, "voice": "alice", "instructions": "Speak softly, with a warm voice. " * 100},
         "instructions"),
        ({"input": TEXT, "voice": "alice", "task_type": "voice_design", "instructions": "A deep voice."},
         "task_type"),
        ({"input": TEXT, "voice": "alice", "task_type": "base", "ref_audio": "bm90IGF1ZGlv"}, "task_type"),
        ({"input": "   ", "voice": "alice"}, "input"),
    ]

    async def run() -> tuple[bytes, list[httpx.Response], bytes]:
        async with httpx.AsyncClient(base_url=cv_server.url, timeout=300) as http:
            solo = await _stream(http, long_body)
            async with http.stream("POST", "/v1/audio/speech", json={**long_body, "stream_format": "audio",
                                                                     "response_format": "pcm"}) as response:
                assert response.status_code == 200
                parts = []
                stream = response.aiter_bytes()
                parts.append(await anext(stream))  # the stream is running
                errors = []
                for body, _ in bad:
                    errors.append(await http.post("/v1/audio/speech", json={**body, "stream": True,
                                                                           "stream_format": "sse"}))
                    errors.append(await http.post("/v1/audio/speech", json=body))
                parts += [chunk async for chunk in stream]
        return solo, errors, b"".join(parts)

    solo, errors, during = asyncio.run(run())
    for i, (_, param) in enumerate(bad):
        for response in errors[2 * i:2 * i + 2]:
            assert _error(response)["param"] == param, response.text
    assert "klingon" in errors[2].json()["error"]["message"]
    assert "too long" in errors[6].json()["error"]["message"]
    assert during == solo  # the stream that ran alongside the bad requests is byte-identical to its solo run
    assert httpx.get(f"{cv_server.url}/health").status_code == 200


def test_voice_upload_refused_without_cloning(cv_server, espeak_server):
    for server in (cv_server, espeak_server):
        response = httpx.post(f"{server.url}/v1/audio/voices", data={"name": "me", "consent": "true"},
                              files={"audio": ("a.wav", _wav(np.zeros(8000, np.float32), 16000), "audio/wav")})
        error = _error(response)
        assert error["code"] == "voice_cloning_unsupported" and "does not support voice cloning" in error["message"]


# ------------------------------------------------------------------------------------------- Base: cloning


def _wav(pcm: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def _voice_sample(seconds: float = 1.5, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(5)
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def _upload(server, name, audio: bytes | None, consent: str | None = "true", ref_text: str | None = None,
            filename: str = "sample.wav") -> httpx.Response:
    data = {"name": name}
    if consent is not None:
        data["consent"] = consent
    if ref_text is not None:
        data["ref_text"] = ref_text
    files = {"audio": (filename, audio, "audio/wav")} if audio is not None else None
    return httpx.post(f"{server.url}/v1/audio/voices", data=data, files=files, timeout=300)


def _voices(server) -> dict:
    return httpx.get(f"{server.url}/v1/audio/voices").json()


def _wait_restarted(server, old_pid: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(f"{server.url}/health", timeout=10)
        if health.status_code == 200 and health.json()["engine_pid"] != old_pid:
            return
        time.sleep(0.2)
    raise TimeoutError("the engine did not come back")


@pytest.mark.timeout(1200)  # the shared CI machine can be very slow
def test_cloned_voice_cycle_on_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    model = build(root / "tiny-base", "base", seed=22)
    voices_dir = root / "voices"
    sample = _voice_sample()
    wav = _wav(sample, 16000)
    ref_text = "Hi there, friend."
    speak = {"input": TEXT, "language": "english", "temperature": 0, "max_new_tokens": 10,
             "response_format": "pcm"}
    inline = {**speak, "ref_audio": base64.b64encode(wav).decode(), "ref_text": ref_text}
    server = start_server("--model", str(model), "--voices-dir", str(voices_dir))
    try:
        listing = _voices(server)
        assert listing["voice_cloning"] is True and listing["voices"] == [] and listing["custom_voices"] == []
        # Base requests need a voice: inline reference audio, or a cloned voice.
        assert _error(_speech(server, {"input": TEXT}))["param"] == "ref_audio"
        assert _error(_speech(server, {"input": TEXT, "ref_audio": "not base64!"}))["param"] == "ref_audio"
        undecodable = base64.b64encode(b"RIFF garbage, not audio" * 10).decode()
        assert "could not be decoded" in _error(_speech(server, {"input": TEXT, "ref_audio": undecodable}))["message"]
        assert _error(_speech(server, {"input": TEXT, "voice": "nobody"}))["param"] == "voice"

        # Refused uploads.
        error = _error(_upload(server, "anna", wav, consent=None))
        assert error["param"] == "consent" and error["code"] == "consent_required"
        assert _error(_upload(server, "anna", wav, consent="no"))["code"] == "consent_required"
        assert _error(_upload(server, "../anna", wav))["code"] == "invalid_voice_name"
        assert _error(_upload(server, "a" * 65, wav))["code"] == "invalid_voice_name"
        assert _error(_upload(server, "anna", None))["param"] == "audio"
        assert "could not be decoded" in _error(_upload(server, "anna", b"not audio at all" * 100))["message"]
        assert _error(_upload(server, "anna", _wav(sample[:800], 16000)))["param"] == "audio"  # 0.05 s: too short
        too_long = _wav(np.zeros(61 * 8000, np.float32), 8000)
        assert "longer than 60 s" in _error(_upload(server, "anna", too_long))["message"]
        response = httpx.post(f"{server.url}/v1/audio/voices", files={"audio": ("a.wav", b"\0" * (11 * 2**20))},
                              data={"name": "anna", "consent": "true"}, timeout=300)
        assert response.status_code == 413
        assert _voices(server)["voices"] == [] and not any(voices_dir.glob("anna"))

        # Upload, list, speak.
        created = _upload(server, "anna", wav, ref_text=ref_text)
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "anna" and created.json()["duration_s"] == 1.5
        assert _upload(server, "anna", wav).status_code == 409
        # x-vector only (no ref_text), its media type in capitals (media types are case-insensitive)
        plain = httpx.Request("POST", f"{server.url}/v1/audio/voices", data={"name": "plain", "consent": "true"},
                              files={"audio": ("sample.wav", wav, "audio/wav")})
        plain.headers["content-type"] = plain.headers["content-type"].replace("multipart/form-data",
                                                                              "Multipart/Form-Data")
        with httpx.Client(timeout=300) as http:
            assert http.send(plain).status_code == 201
        listing = _voices(server)
        assert listing["voices"] == ["anna", "plain"]
        assert [v["name"] for v in listing["custom_voices"]] == ["anna", "plain"]
        assert listing["custom_voices"][0]["ref_text"] == ref_text and listing["custom_voices"][0]["consent"]
        assert (voices_dir / "anna" / "audio.wav").is_file() and (voices_dir / "anna" / "voice.json").is_file()

        reference = _speech(server, inline)
        assert reference.status_code == 200 and len(reference.content) > 0
        by_name = _speech(server, {**speak, "voice": "anna"})
        assert by_name.status_code == 200
        assert by_name.content == reference.content  # the stored voice speaks like the same inline reference
        plain = _speech(server, {**speak, "voice": "plain"}).content
        assert plain != by_name.content  # in-context (ref_text) and x-vector cloning differ
        sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300)
        with sdk.audio.speech.with_streaming_response.create(
                model="tiny-base", voice="anna", input=TEXT, response_format="pcm", stream_format="sse",
                extra_body={k: v for k, v in speak.items() if k not in ("input", "response_format")}) as response:
            assert sse_pcm(parse_sse(response.read())) == reference.content

        # The engine core dies and is restarted: the voices are registered again before it is ready.
        pid = httpx.get(f"{server.url}/health").json()["engine_pid"]
        os.kill(pid, signal.SIGKILL)
        _wait_restarted(server, pid)
        assert _voices(server)["voices"] == ["anna", "plain"]
        assert _speech(server, {**speak, "voice": "anna"}).content == reference.content

        # Delete one; it is gone from the list, from speech and from disk.
        deleted = httpx.delete(f"{server.url}/v1/audio/voices/plain")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert httpx.delete(f"{server.url}/v1/audio/voices/plain").status_code == 404
        assert httpx.delete(f"{server.url}/v1/audio/voices/nobody").status_code == 404
        assert _voices(server)["voices"] == ["anna"]
        assert _error(_speech(server, {**speak, "voice": "plain"}))["param"] == "voice"
        assert not (voices_dir / "plain").exists()
    finally:
        server.stop()

    # A new server on the same directory restores what is stored.
    server = start_server("--model", str(model), "--voices-dir", str(voices_dir))
    try:
        assert _voices(server)["voices"] == ["anna"]
        assert _speech(server, {**speak, "voice": "anna"}).content == reference.content
        assert httpx.delete(f"{server.url}/v1/audio/voices/anna").status_code == 200
        assert _voices(server)["voices"] == [] and not any(p for p in voices_dir.iterdir())
    finally:
        server.stop()

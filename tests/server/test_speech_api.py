"""`/v1/audio/speech` through the official `openai` SDK and plain HTTP, on a real server."""

from __future__ import annotations

import asyncio
import base64
import io
import struct

import av
import httpx
import numpy as np
import openai
import pytest

from benchmarks.build_tiny_qwen3 import build
from streamvox.audio.formats import encode_audio
from tests.helpers.audio import decode_file, estimate_duration, parse_sse, sse_pcm
from tests.helpers.server import start_server

TEXT = "The quick brown fox jumps over the lazy dog, then rests under a tall oak tree."
FORMATS = ["pcm", "wav", "flac", "mp3", "opus", "aac"]
CODEC_PADDING_S = 0.1  # what an mp3/aac/opus encoder adds at the ends (delay, last frame), at most


@pytest.fixture(scope="module")
def client(espeak_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{espeak_server.url}/v1", api_key="unused")


@pytest.mark.parametrize(
    "fmt,rate", [("wav", 24000), ("pcm", 24000), ("flac", 24000), ("mp3", 24000), ("opus", 48000), ("aac", 24000)]
)
def test_sdk_every_format_decodes_to_expected_rate_and_duration(client, fmt, rate):
    response = client.audio.speech.create(model="espeak", voice="alloy", input=TEXT, response_format=fmt)
    samples, decoded_rate = decode_file(response.content, fmt)
    assert decoded_rate == rate
    duration = len(samples) / decoded_rate
    assert abs(duration - estimate_duration(TEXT)) <= 0.3 * estimate_duration(TEXT), duration
    assert float(abs(samples).max()) > 0.05  # not silence


def test_sdk_openai_model_alias_and_sample_rate(client):
    response = client.audio.speech.create(model="tts-1", voice="nova", input="Hello there.",
                                          response_format="wav", extra_body={"sample_rate": 16000})
    samples, rate = decode_file(response.content, "wav")
    assert rate == 16000 and len(samples) > 8000


def test_sdk_streaming_sse(client):
    with client.audio.speech.with_streaming_response.create(
        model="espeak", voice="echo", input=TEXT, response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.read())
    kinds = [e["type"] for e in events]
    assert kinds.count("speech.audio.delta") > 1
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.done") == 1
    usage = events[-1]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    whole = client.audio.speech.create(model="espeak", voice="echo", input=TEXT, response_format="pcm")
    assert sse_pcm(events) == whole.content  # deltas concatenate to the non-streaming clip


def test_sdk_streaming_audio_pcm_and_wav(client):
    with client.audio.speech.with_streaming_response.create(
        model="espeak", voice="fable", input=TEXT, response_format="pcm", stream_format="audio"
    ) as response:
        chunks = list(response.iter_bytes())
    pcm = b"".join(chunks)
    assert len(chunks) > 1
    whole = client.audio.speech.create(model="espeak", voice="fable", input=TEXT, response_format="pcm")
    assert pcm == whole.content

    with client.audio.speech.with_streaming_response.create(
        model="espeak", voice="fable", input=TEXT, response_format="wav", stream_format="audio"
    ) as response:
        body = response.read()
    assert body[:4] == b"RIFF" and struct.unpack("<I", body[4:8])[0] == 0xFFFFFFFF
    assert body[36:40] == b"data" and struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF
    assert body[44:] == whole.content


def test_stream_true_means_sse(espeak_server):
    response = httpx.post(f"{espeak_server.url}/v1/audio/speech",
                          json={"input": "Hi there.", "stream": True, "response_format": "pcm"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert parse_sse(response.content)[-1]["type"] == "speech.audio.done"


def test_speed_changes_duration(client):
    slow = client.audio.speech.create(model="espeak", voice="alloy", input=TEXT, response_format="wav", speed=0.6)
    fast = client.audio.speech.create(model="espeak", voice="alloy", input=TEXT, response_format="wav", speed=2.0)
    slow_s = len(decode_file(slow.content, "wav")[0]) / 24000
    fast_s = len(decode_file(fast.content, "wav")[0]) / 24000
    assert slow_s > 2 * fast_s


async def _pcm(client: httpx.AsyncClient, text: str, voice: str) -> bytes:
    body = {"model": "espeak", "input": text, "voice": voice, "response_format": "pcm", "stream_format": "audio"}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_bytes()])


def test_16_concurrent_requests_equal_their_solo_runs(espeak_server):
    voices = ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
              "en-us", "de", "fr-be", "es", "it"]
    texts = [f"Request number {i} says: {' '.join(['word'] * (i + 1))}, and then it stops." for i in range(16)]

    async def run() -> tuple[list[bytes], list[bytes]]:
        async with httpx.AsyncClient(base_url=espeak_server.url, timeout=60) as client:
            solo = [await _pcm(client, t, v) for t, v in zip(texts, voices, strict=True)]
            together = await asyncio.gather(*(_pcm(client, t, v) for t, v in zip(texts, voices, strict=True)))
        return solo, list(together)

    solo, together = asyncio.run(run())
    assert len(set(solo)) == 16  # every request really is different
    for i in range(16):
        assert together[i] == solo[i], f"request {i} differs from its solo run"


def test_disconnect_mid_stream_frees_request_state(espeak_server):
    text = "This is a long passage that keeps the engine busy for a while. " * 60

    async def run() -> None:
        async with httpx.AsyncClient(base_url=espeak_server.url, timeout=30) as client:
            for _ in range(5):
                body = {"input": text, "response_format": "pcm", "stream_format": "sse"}
                async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                    async for _chunk in response.aiter_bytes():
                        break  # hang up after the first bytes

    asyncio.run(run())
    deadline = asyncio.run(_wait_for_idle(espeak_server))
    assert deadline, "active requests did not return to 0"


async def _wait_for_idle(server, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if server.metric("streamvox_active_requests") == 0:
            return True
        await asyncio.sleep(0.05)
    return False


_TONE_WAV = encode_audio(0.3 * np.sin(np.arange(12000, dtype=np.float32) / 5), 24000, "wav")

BAD_REQUESTS = [
    # (body, status, param, words expected in the message)
    ({"model": "espeak", "voice": "alloy"}, 400, "input", "input"),
    ({"model": "espeak", "input": "   "}, 400, "input", "non-empty"),
    ({"model": "espeak", "input": "x" * 5000}, 400, "input", "longer"),
    ({"model": "nope", "input": "hi"}, 404, "model", "does not exist"),
    ({"input": "hi", "voice": "nobody"}, 400, "voice", "Unknown voice"),
    ({"input": "hi", "speed": 9}, 400, "speed", "between"),
    ({"input": "hi", "speed": 0.1}, 400, "speed", "between"),
    ({"input": "hi", "speed": "fast"}, 400, "speed", "number"),
    ({"input": "hi", "response_format": "ogg"}, 400, "response_format", "must be one of"),
    ({"input": "hi", "stream_format": "chunks"}, 400, "stream_format", "sse"),
    ({"input": "hi", "sample_rate": 100}, 400, "sample_rate", "between"),
    ({"input": "hi", "language": "klingon"}, 400, "language", "Unsupported language"),
    ({"input": "hi", "bogus_field": 1}, 400, "bogus_field", "Unrecognized"),
    ({"input": "hi", "ref_audio": "!!notbase64!!"}, 400, "ref_audio", "base64"),
    ({"input": "hi", "ref_audio": "aGVsbG8gd29ybGQ="}, 400, "ref_audio", "decoded"),
    ({"input": "hi", "ref_audio": base64.b64encode(_TONE_WAV).decode()}, 400, "ref_audio", "voice cloning"),
    ({"input": "hi", "ref_text": "x" * 2049}, 400, "ref_text", "longer than 2048"),
    ([1, 2, 3], 400, None, "JSON object"),
    ("not json", 400, None, "not valid JSON"),
]


def test_voice_and_language_names_match_whatever_their_case(espeak_server):
    def pcm(voice: str, language: str) -> bytes:
        response = httpx.post(f"{espeak_server.url}/v1/audio/speech", timeout=60, json={
            "input": "Case does not matter.", "voice": voice, "language": language, "response_format": "pcm"})
        assert response.status_code == 200, response.text
        return response.content

    assert pcm("Alloy", "EN-US") == pcm("alloy", "en-us")


def test_bad_requests_get_documented_errors_while_a_good_stream_completes(espeak_server):
    good_body = {"input": TEXT * 3, "response_format": "pcm", "stream_format": "audio", "voice": "onyx"}

    async def run():
        async with httpx.AsyncClient(base_url=espeak_server.url, timeout=60) as client:
            reference = await _pcm(client, good_body["input"], "onyx")

            async def good() -> bytes:
                async with client.stream("POST", "/v1/audio/speech", json=good_body) as response:
                    parts = []
                    async for chunk in response.aiter_bytes():
                        parts.append(chunk)
                        await asyncio.sleep(0.002)  # a slowish reader, so the bad requests overlap it
                    return b"".join(parts)

            async def bad(body):
                if isinstance(body, str):
                    return await client.post("/v1/audio/speech", content=body)
                return await client.post("/v1/audio/speech", json=body)

            results = await asyncio.gather(good(), *(bad(b) for b, *_ in BAD_REQUESTS))
            return reference, results[0], results[1:]

    reference, streamed, responses = asyncio.run(run())
    assert streamed == reference
    for (body, status, param, words), response in zip(BAD_REQUESTS, responses, strict=True):
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == param, (body, error)
        assert words in error["message"], (body, error)


# ------------------------------------------------------------------------------------ every format streams


def _av_decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a body with FFmpeg (PyAV), as a streaming client would: float32 mono and its rate."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    pcm = np.concatenate(frames)
    return (pcm.astype(np.float32) / 32768 if pcm.dtype == np.int16 else pcm.astype(np.float32)), rate


def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, 24000
    return _av_decode(data)


def _speech(server, body: dict) -> tuple[httpx.Response, list[bytes]]:
    """POST and read the body as it arrives: the response, and the pieces (SSE: the decoded audio deltas)."""
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=120) as response:
        pieces = [piece for piece in response.iter_raw() if piece]
    if body.get("stream_format") == "sse":
        events = parse_sse(b"".join(pieces))
        assert events[-1]["type"] == "speech.audio.done", events[-1]
        pieces = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    return response, pieces


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_text_with_nothing_to_say_is_a_short_silence_in_every_format(espeak_server, fmt):
    """ "..." or an emoji makes no sound: the reply is 0.1 s of silence that decodes (an agent's TTS plugin
    counts a reply with no audio as an error)."""
    for text in ("...", "👍"):
        response, pieces = _speech(espeak_server, {"model": "espeak", "input": text, "response_format": fmt})
        assert response.status_code == 200
        audio, rate = _decode(b"".join(pieces), fmt)
        assert 0.09 <= len(audio) / rate <= 0.1 + CODEC_PADDING_S and np.abs(audio).max() <= 0.01, (text, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streams_in_every_mode_and_decodes_as_the_file(espeak_server, fmt):
    base = {"model": "espeak", "voice": "alloy", "input": TEXT, "response_format": fmt}
    file_response, file_pieces = _speech(espeak_server, base)
    assert file_response.status_code == 200
    file_audio, rate = _decode(b"".join(file_pieces), fmt)
    if fmt == "flac":  # a whole file that states its length, as libsndfile writes it
        assert file_response.headers["content-length"] == str(sum(map(len, file_pieces)))
    else:  # the file streams as it is made (chunked), in more than one piece
        assert file_response.headers.get("transfer-encoding") == "chunked" and len(file_pieces) > 1
    streams = {}
    for mode in ("audio", "sse"):
        response, pieces = _speech(espeak_server, {**base, "stream_format": mode})
        assert response.status_code == 200 and len(pieces) > 1, (mode, len(pieces))
        assert response.headers["x-sample-rate"] == file_response.headers["x-sample-rate"]
        if mode == "audio":
            assert response.headers["content-type"] == file_response.headers["content-type"]
        # Every delta continues a stream that plays as it arrives: the first one alone already decodes.
        first = next(i for i in range(len(pieces)) if _playable(b"".join(pieces[:i + 1]), fmt))
        assert first <= 2, (mode, first)
        streams[mode] = b"".join(pieces)
    assert streams["audio"] == streams["sse"]  # SSE carries the very bytes of the audio stream
    audio, stream_rate = _decode(streams["audio"], fmt)
    assert stream_rate == rate
    if fmt == "pcm":
        assert streams["audio"] == b"".join(file_pieces)
    elif fmt == "wav":  # the file is the stream too: the pcm stream behind a header of unknown length
        assert streams["audio"][:4] == b"RIFF" and struct.unpack("<I", streams["audio"][40:44])[0] == 0xFFFFFFFF
        pcm = _speech(espeak_server, {**base, "response_format": "pcm"})[1]
        assert streams["audio"][44:] == b"".join(pcm) and streams["audio"] == b"".join(file_pieces)
    elif fmt == "flac":  # lossless: the stream holds the pcm stream's samples, the file libsndfile's (as wav)
        assert len(audio) == len(file_audio) and np.abs(audio - file_audio).max() <= 2 / 32768
    else:
        assert abs(len(audio) - len(file_audio)) / rate <= CODEC_PADDING_S
        n = min(len(audio), len(file_audio))
        assert np.corrcoef(audio[:n], file_audio[:n])[0, 1] > 0.99
    assert abs(len(audio) / rate - estimate_duration(TEXT)) <= 0.3 * estimate_duration(TEXT)


@pytest.mark.parametrize("fmt,carried", [("mp3", 11025), ("aac", 11025), ("opus", 12000)])
def test_a_rate_the_codec_lacks_is_carried_at_the_next_one_it_has(espeak_server, fmt, carried):
    base = {"voice": "alloy", "input": "Hello there.", "response_format": fmt, "sample_rate": 10000}
    for extra in ({}, {"stream_format": "audio"}, {"stream_format": "sse"}):
        response, pieces = _speech(espeak_server, {**base, **extra})
        assert response.status_code == 200 and response.headers["x-sample-rate"] == str(carried), extra
        audio, rate = _decode(b"".join(pieces), fmt)
        assert rate == (48000 if fmt == "opus" else carried) and float(np.abs(audio).max()) > 0.05, extra
    batch = httpx.post(f"{espeak_server.url}/v1/audio/speech/batch", timeout=60,
                       json={"items": [{**base, "response_format": "wav"}, base]})
    assert batch.status_code == 200, batch.text
    items = batch.json()["data"]
    assert [item["status"] for item in items] == ["succeeded", "succeeded"], items
    assert [item["sample_rate"] for item in items] == [10000, carried]


def _playable(prefix: bytes, fmt: str) -> bool:
    if fmt == "pcm":
        return len(prefix) > 0
    try:
        return len(_av_decode(prefix)[0]) > 0
    except (av.error.FFmpegError, ValueError):
        return False


def test_a_voice_object_without_an_id_is_refused(espeak_server):
    for voice in ({"name": "nova"}, {"id": None}, {"id": ""}):
        response = httpx.post(f"{espeak_server.url}/v1/audio/speech", timeout=60,
                              json={"input": "hi", "voice": voice})
        assert response.status_code == 400 and response.json()["error"]["param"] == "voice", (voice, response.text)
    ok = httpx.post(f"{espeak_server.url}/v1/audio/speech", json={"input": "hi", "voice": {"id": "nova"}}, timeout=60)
    assert ok.status_code == 200 and ok.content


def test_errors_before_the_first_audio_are_json_in_every_mode(espeak_server):
    for extra in ({}, {"stream_format": "audio"}, {"stream_format": "sse"}):
        response = httpx.post(f"{espeak_server.url}/v1/audio/speech", timeout=60,
                              json={"input": "hi", "response_format": "mp3", "voice": "nobody", **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == "voice"


# ------------------------------------------------------------------------------------------------ speed


def _duration(server, body: dict) -> float:
    response = httpx.post(f"{server.url}/v1/audio/speech", json={**body, "response_format": "pcm"}, timeout=600)
    assert response.status_code == 200, response.text
    return len(response.content) / 2 / body.get("sample_rate", 24000)


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 4.0])
def test_espeak_speed_scales_the_duration(espeak_server, speed):
    body = {"input": TEXT, "voice": "nova"}
    normal = _duration(espeak_server, body)
    assert abs(_duration(espeak_server, {**body, "speed": speed}) / (normal / speed) - 1) <= 0.02


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory):
    model = build(tmp_path_factory.mktemp("speed") / "tiny-cv", "custom_voice", seed=21)
    server = start_server("--model", str(model))
    yield server
    server.stop()


QWEN3 = {"input": "Hello world, this is streaming speech!", "voice": "alice", "language": "english",
         "temperature": 0, "seed": 7, "max_new_tokens": 24, "initial_codec_chunk_frames": 2}


@pytest.mark.timeout(1200)  # the shared CI machine can be very slow
def test_qwen3_speed_is_time_stretched_and_streams_as_the_file(qwen3_server):
    normal = _duration(qwen3_server, QWEN3)
    assert normal > 0.5
    for speed in (0.5, 2.0):
        assert abs(_duration(qwen3_server, {**QWEN3, "speed": speed}) / (normal / speed) - 1) <= 0.02
    at_16k = {**QWEN3, "speed": 1.5, "sample_rate": 16000}  # stretched, then resampled
    assert abs(_duration(qwen3_server, at_16k) / (normal / 1.5) - 1) <= 0.02
    file = httpx.post(f"{qwen3_server.url}/v1/audio/speech", timeout=600,
                      json={**at_16k, "response_format": "pcm"}).content
    response, pieces = _speech(qwen3_server, {**at_16k, "response_format": "pcm", "stream_format": "sse"})
    assert len(pieces) > 1 and b"".join(pieces) == file  # one stream: the same bytes either way


@pytest.mark.timeout(1200)
def test_qwen3_streams_compressed_formats_and_a_refused_request_is_json(qwen3_server):
    response, pieces = _speech(qwen3_server, {**QWEN3, "response_format": "opus", "speed": 1.25})
    assert response.status_code == 200 and response.headers.get("transfer-encoding") == "chunked"
    audio, rate = _av_decode(b"".join(pieces))
    assert rate == 48000 and abs(len(audio) / rate - _duration(qwen3_server, QWEN3) / 1.25) <= CODEC_PADDING_S
    # Refused by the model itself (over its instruction-token cap), before any audio: still a JSON 400.
    refused = httpx.post(f"{qwen3_server.url}/v1/audio/speech", timeout=600,
                         json={**QWEN3, "response_format": "mp3", "instructions": "Speak softly, please. " * 150})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "instructions"

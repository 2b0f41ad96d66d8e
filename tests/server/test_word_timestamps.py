"""Word timestamps on the wire: `/v1/audio/speech` (SSE and JSON) and `WS /v1/audio/speech/stream`."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import httpx
import pytest
import websockets

from streamvox.contract import ModelInfo, WordTimings
from streamvox.server.errors import APIError
from streamvox.server.word_timestamps import parse_word_timestamps, spoken_prefix
from tests.helpers.audio import decode_file, parse_sse, sse_pcm

TEXT = "Captions follow the voice: 42 words, give or take, spoken at 3.5 words a second. Then it's done!"
RATE = 24000


def _tokens(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def _check(timings: dict, text: str, duration: float) -> None:
    """Every input word once, verbatim, in order; times monotone and within the audio."""
    spans = list(zip(timings["words"], timings["char_start"], timings["char_end"], strict=True))
    assert spans == _tokens(text)
    previous = 0.0
    for start, end in zip(timings["start"], timings["end"], strict=True):
        assert previous <= start <= end <= duration + 1e-3
        previous = end


def _sse_timings(events: list[dict]) -> dict:
    """The timestamps events joined, each checked to come after the audio it covers and before done."""
    heard, joined = 0.0, {key: [] for key in ("words", "start", "end", "char_start", "char_end")}
    assert events[-1]["type"] == "speech.audio.done"
    for event in events[:-1]:
        if event["type"] == "speech.audio.delta":
            heard += len(base64.b64decode(event["audio"])) / 2 / RATE
        else:
            assert event["type"] == "speech.audio.timestamps", event
            assert set(event) == {"type", *joined}
            assert event["end"][-1] <= heard + 1e-3, "a timestamp overtook its audio"
            for key in joined:
                joined[key] += event[key]
    return joined


def _speech(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", json={"model": "espeak", **body}, timeout=60)


def test_sse_timestamps_follow_their_audio_and_cover_every_word(espeak_server):
    response = _speech(espeak_server, input=TEXT, response_format="pcm", stream_format="sse", word_timestamps=True)
    assert response.status_code == 200
    events = parse_sse(response.content)
    timings = _sse_timings(events)
    _check(timings, TEXT, len(sse_pcm(events)) / 2 / RATE)
    assert sum(e["type"] == "speech.audio.timestamps" for e in events) >= 2  # clause by clause
    # the audio is the one a request without timestamps gets
    plain = parse_sse(_speech(espeak_server, input=TEXT, response_format="pcm", stream_format="sse").content)
    assert sse_pcm(plain) == sse_pcm(events)
    assert not any(e["type"] == "speech.audio.timestamps" for e in plain)


def test_whole_response_is_json_with_audio_and_the_same_timings(espeak_server):
    streamed = _sse_timings(parse_sse(_speech(espeak_server, input=TEXT, response_format="pcm", stream_format="sse",
                                              word_timestamps=True).content))
    for fmt, rate in (("wav", 16000), ("mp3", 24000)):
        response = _speech(espeak_server, input=TEXT, response_format=fmt, sample_rate=rate, word_timestamps=True)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        body = response.json()
        assert body["format"] == fmt and body["sample_rate"] == rate
        samples, decoded_rate = decode_file(base64.b64decode(body["audio"]), fmt)
        assert decoded_rate == rate
        _check(body, TEXT, len(samples) / rate + 0.05)  # mp3 pads a frame
        # seconds, whatever the output rate: resampling leaves them as they are
        assert {k: body[k] for k in streamed} == streamed
        assert body["usage"]["total_tokens"] > 0


def test_sixteen_concurrent_streams_each_get_their_own_words(espeak_server):
    texts = [f"Stream number {i} says {' '.join(['alpha', 'bravo', 'charlie', 'delta'][: 1 + i % 4])}, "
             f"then {i * 7} more words end it." for i in range(16)]

    async def one(client: httpx.AsyncClient, text: str) -> tuple[dict, float]:
        response = await client.post(f"{espeak_server.url}/v1/audio/speech", timeout=120, json={
            "input": text, "response_format": "pcm", "stream_format": "sse", "word_timestamps": True})
        events = parse_sse(response.content)
        return _sse_timings(events), len(sse_pcm(events)) / 2 / RATE

    async def run():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(one(client, text) for text in texts))

    for text, (timings, duration) in zip(texts, asyncio.run(run()), strict=True):
        _check(timings, text, duration)


def test_bad_word_timestamps_get_protocol_shaped_errors(espeak_server):
    for value in ("yes", 1, [True], {"on": True}):
        response = _speech(espeak_server, input=TEXT, stream_format="sse", word_timestamps=value)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "word_timestamps" and error["type"] == "invalid_request_error"
    response = _speech(espeak_server, input=TEXT, response_format="pcm", stream_format="audio", word_timestamps=True)
    assert response.status_code == 400 and response.json()["error"]["param"] == "word_timestamps"


def test_a_model_without_an_aligner_names_the_flag():
    info = ModelInfo(name="tiny", family="qwen3_tts", sample_rate=24000, voices=["a"], default_voice="a")
    assert parse_word_timestamps({}, info) is False
    assert parse_word_timestamps({"word_timestamps": False}, info) is False
    with pytest.raises(APIError) as refused:
        parse_word_timestamps({"word_timestamps": True}, info)
    assert refused.value.status == 400 and refused.value.param == "word_timestamps"
    assert "--aligner pocketsphinx" in refused.value.message


def test_spoken_prefix_cuts_after_the_last_word_that_started():
    text = "Hello there, world."
    timings = WordTimings(["Hello", "there,", "world."], [0.0, 0.4, 0.9], [0.4, 0.8, 1.3], [0, 6, 13], [5, 12, 19])
    assert spoken_prefix(text, timings, 0.0) == ""
    assert spoken_prefix(text, timings, 0.41) == "Hello there,"
    assert spoken_prefix(text, timings, 5.0) == text


class _Stream:
    def __init__(self, ws) -> None:
        self.ws = ws

    async def send(self, **event) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self) -> dict | bytes:
        message = await asyncio.wait_for(self.ws.recv(), 30)
        return message if isinstance(message, bytes) else json.loads(message)

    async def utterance(self) -> tuple[int, float, list[dict], dict]:
        """(index, seconds of audio, its audio.timestamps events, audio.done), checking their order."""
        start = await self.recv()
        assert start["type"] == "audio.start"
        samples, events = 0, []
        while True:
            message = await self.recv()
            if isinstance(message, bytes):
                samples += len(message) // 2
            elif message["type"] == "audio.timestamps":
                assert message["utterance_index"] == start["utterance_index"]
                assert message["end"][-1] <= samples / RATE + 1e-3, "a timestamp overtook its audio"
                events.append(message)
            else:
                assert message["type"] == "audio.done", message
                return start["utterance_index"], samples / RATE, events, message


def test_speech_stream_sends_timestamps_per_utterance_and_the_whole_alignment_on_done(espeak_server):
    first = "Streaming text, token by token, gets timed as it is spoken. "
    second = "A second utterance counts from its own start."

    async def run(split: str) -> list[tuple]:
        async with websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream") as ws:
            client = _Stream(ws)
            await client.send(type="session.config", sample_rate=RATE, word_timestamps=True, text_split=split)
            for text in (first, second):
                for piece in re.findall(r"\S+\s*", text):
                    await client.send(type="input.text", text=piece)
                await client.send(type="input.done")
            return [await client.utterance(), await client.utterance()]

    results = {split: asyncio.run(run(split)) for split in ("none", "sentence")}
    for utterances in results.values():
        for (index, duration, events, done), text in zip(utterances, (first, second), strict=True):
            assert index in (0, 1) and done["reason"] == "stop"
            whole = done["timestamps"]
            joined = {key: [v for e in events for v in e[key]] for key in whole}
            assert joined == whole
            _check(whole, text, duration)
    # one request per sentence, or one for the utterance: the same timings in the utterance
    assert [u[3]["timestamps"] for u in results["none"]] == [u[3]["timestamps"] for u in results["sentence"]]


@pytest.mark.parametrize("split", ["none", "sentence", "clause"])
def test_speech_stream_times_the_words_of_pieces_nothing_speaks(espeak_server, split):
    """Pieces with no letter or digit (split off and spoken by no request) keep their words in the timings, with
    no length, in place; the trailing one too."""
    text = "Hello. ??? World! 😀 ok. ..."

    async def run() -> tuple:
        async with websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream") as ws:
            client = _Stream(ws)
            await client.send(type="session.config", sample_rate=RATE, word_timestamps=True, text_split=split)
            for piece in re.findall(r"\S+\s*", text):
                await client.send(type="input.text", text=piece)
            await client.send(type="input.done")
            return await client.utterance()

    _, duration, events, done = asyncio.run(run())
    whole = done["timestamps"]
    assert {key: [v for e in events for v in e[key]] for key in whole} == whole
    _check(whole, text, duration)
    for word, start, end in zip(whole["words"], whole["start"], whole["end"], strict=True):
        if word in ("???", "..."):
            assert start == end


def test_speech_stream_refuses_a_bad_word_timestamps_config(espeak_server):
    async def run():
        async with websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream") as ws:
            client = _Stream(ws)
            await client.send(type="session.config", word_timestamps="true")
            error = await client.recv()
            assert error["type"] == "error" and error["param"] == "word_timestamps"
            await client.send(type="input.text", text="Still works.")  # the session goes on, without timings
            await client.send(type="input.done")
            _, duration, events, done = await client.utterance()
            assert duration > 0.3 and not events and "timestamps" not in done

    asyncio.run(run())

"""Cartesia's API (`WS /tts/websocket`, `POST /tts/bytes`) against a real eSpeak server, with raw clients.

Each context's audio and word timings are compared with the same messages sent alone on a fresh socket: many
overlapping contexts on one socket, and many sockets at once, each get exactly their own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import websockets

from tests.helpers.cartesia_client import (
    KEY,
    RATE,
    SETTINGS,
    Result,
    Socket,
    active_requests,
    check_context,
    connect,
    llm_pieces,
    solo,
)
from tests.helpers.server import Server, free_port, start_server

TEXTS = [
    "Good morning, and welcome aboard.", "The train to the coast leaves at nine.",
    "Please mind the gap, and hold the rail.", "Tea, coffee, or water, sir?",
    "It rained all night; the roads are wet.", "Five red kites flew over the hill.",
    "Turn left at the bakery, then go straight.", "Her answer was short: no, thank you.",
    "We need three eggs, flour, and milk.", "The museum opens at ten on Sundays.",
    "A quiet river runs past the old mill.", "Bring a coat, because it will be cold.",
    "Twelve people waited at the bus stop.", "Is this the road to the harbour?",
    "The lamp flickered, then went dark.", "Thank you for calling, goodbye.",
]
LONG_TEXT = " ".join(TEXTS * 3)


@pytest.fixture(scope="module")
def server():
    server = start_server(api_key=KEY)
    yield server
    server.stop()


def test_a_context_streams_audio_then_timestamps_then_done(server):
    text = "Hello there, how are you today? The weather is fine."
    result = asyncio.run(solo(server, llm_pieces(text)))
    check_context(result)
    assert result.messages[0]["type"] == "chunk" and result.messages[-1]["type"] == "done"
    assert [w for w, _, _ in result.words] == text.split(" ")  # the text's words, punctuation attached
    assert result.words[-1][2] <= len(result.audio) / 2 / RATE + 1e-3
    whole = httpx.post(f"{server.url}/tts/bytes", headers={"X-API-Key": KEY}, timeout=60,
                       json={**{k: v for k, v in SETTINGS.items() if k != "add_timestamps"}, "transcript": text})
    assert whole.status_code == 200 and abs(len(whole.content) - len(result.audio)) < 0.2 * RATE * 2


def test_sixteen_overlapping_contexts_on_one_socket_each_get_their_own(server):
    async def run() -> None:
        solos = [await solo(server, llm_pieces(text)) for text in TEXTS]
        async with connect(server) as ws:
            socket = Socket(ws)
            streams = [llm_pieces(text) for text in TEXTS]
            for step in range(max(map(len, streams))):  # round-robin: every context open at once
                for i, pieces in enumerate(streams):
                    if step < len(pieces):
                        await socket.send(f"ctx-{i}", pieces[step], step < len(pieces) - 1)
            await socket.until_ended(*(f"ctx-{i}" for i in range(len(TEXTS))))
        for i, alone in enumerate(solos):
            check_context(socket.results[f"ctx-{i}"], alone)

    asyncio.run(run())


def test_thirty_two_sockets_at_once_each_get_their_own(server):
    async def one(i: int) -> Result:
        async with connect(server) as ws:
            socket = Socket(ws)
            for j, piece in enumerate(pieces := llm_pieces(TEXTS[i % len(TEXTS)])):
                await socket.send("same-id", piece, j < len(pieces) - 1)
                await asyncio.sleep(0.01)
            await socket.until_ended("same-id")
            return socket.results["same-id"]

    async def run() -> None:
        solos = [await solo(server, llm_pieces(text)) for text in TEXTS]
        results = await asyncio.gather(*(one(i) for i in range(32)))
        for i, result in enumerate(results):
            check_context(result, solos[i % len(TEXTS)])

    asyncio.run(run())


def test_bad_messages_get_an_error_and_other_contexts_go_on(server):
    async def run() -> Socket:
        async with connect(server) as ws:
            socket = Socket(ws)
            await socket.send("good", "A long sentence keeps this context busy,", True)
            await ws.send("{not json")
            await ws.send(b"\x00\x01binary")
            await ws.send(json.dumps({"transcript": "no context id", "continue": False}))
            await socket.send("unknown-field", "Hello.", False, colour="blue")
            await socket.send("bad-voice", "Hello.", False, voice={"mode": "id", "id": "nobody"})
            await socket.send("embedding", "Hello.", False, voice={"mode": "embedding", "embedding": [0.1] * 192})
            await socket.send("long", "x" * 70000, False)
            await socket.send("bad-rate", "Hello.", False, output_format={"container": "raw", "sample_rate": 5})
            await socket.send("bad-speed", "Hello.", False, generation_config={"speed": 9})
            await socket.send("bad-model", "Hello.", False, model_id="gpt-4o-mini-tts")
            await socket.send("good", " and then it ends.", False)
            await socket.until_ended("good", "unknown-field", "bad-voice", "embedding", "long", "bad-rate",
                                     "bad-speed", "bad-model")
            while len(socket.results[None].messages) < 3:
                await socket.receive()
            # the socket still works
            await socket.send("after", "Still here.", False)
            await socket.until_ended("after")
            return socket

    socket = asyncio.run(run())
    check_context(socket.results["good"])
    check_context(socket.results["after"])
    codes = [m["code"] for m in socket.results[None].messages]
    assert codes == ["invalid_json", "invalid_frame", "invalid_value"], socket.results[None].messages
    errors = {cid: socket.results[cid].messages for cid in ("unknown-field", "bad-voice", "embedding", "long",
                                                             "bad-rate", "bad-speed", "bad-model")}
    assert all(len(messages) == 1 and messages[0]["type"] == "error" for messages in errors.values()), errors
    params = {cid: messages[0].get("param") for cid, messages in errors.items()}
    assert params == {"unknown-field": "colour", "bad-voice": "voice.id", "embedding": "voice.embedding",
                      "long": "transcript", "bad-rate": "output_format.sample_rate",
                      "bad-speed": "generation_config.speed", "bad-model": "model_id"}
    assert "nobody" in errors["bad-voice"][0]["error"] and "speaker embeddings" in errors["embedding"][0]["error"]


def test_cancel_stops_the_audio_within_a_chunk_and_the_socket_goes_on(server):
    async def run() -> tuple[Socket, int]:
        async with connect(server) as ws:
            socket = Socket(ws)
            await socket.send("long", LONG_TEXT, False)
            while len(socket.results["long"].audio) == 0:
                await socket.receive()
            await ws.send(json.dumps({"context_id": "long", "cancel": True}))
            cancelled_at = len(socket.results["long"].messages)
            await socket.send("next", "The next turn works.", False)
            await socket.until_ended("next")
            await asyncio.sleep(0.5)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await socket.receive()
            return socket, cancelled_at

    socket, cancelled_at = asyncio.run(run())
    late = socket.results["long"].messages[cancelled_at:]
    assert [m["type"] for m in late].count("chunk") <= 1 and all(m["type"] != "done" for m in late), late
    assert len(socket.results["long"].audio) / 2 / RATE < 10  # the whole text is over 40 s
    check_context(socket.results["next"])
    assert active_requests(server) == 0


def test_an_idle_socket_is_closed_but_a_long_context_is_not_cut():
    """With a 1 s idle timeout: a silent socket gets `idle_timeout` and close 1000; a context whose audio takes
    longer (its client reads slowly) is spoken whole, and its socket's idle time starts when it ends; a socket
    that keeps sending stays open."""
    server = start_server(api_key=KEY, env={"STREAMVOX_CARTESIA_IDLE_TIMEOUT_S": "1"})

    async def closed_when_idle(ws) -> tuple[dict, int]:
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with pytest.raises(websockets.ConnectionClosedOK) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        return error, closed.value.rcvd.code

    async def silent() -> tuple[dict, int, float]:
        async with connect(server) as ws:
            start = time.monotonic()
            error, code = await closed_when_idle(ws)
            return error, code, time.monotonic() - start

    async def chatty() -> Socket:
        async with connect(server) as ws:
            chat = Socket(ws)
            for i in range(8):  # a message every 0.4 s, 3 s in all; whitespace is done without audio
                await chat.send(f"blank-{i}", " ", False)
                await chat.until_ended(f"blank-{i}")
                await asyncio.sleep(0.4)
            await chat.send("last", "Still here.", False)
            await chat.until_ended("last")
            return chat

    async def slow_reader() -> tuple[Socket, int, float, dict, int]:
        async with websockets.connect(f"{server.ws_url}/tts/websocket", additional_headers={"X-API-Key": KEY},
                                      max_size=None, max_queue=1) as ws:
            ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            reader = Socket(ws, rate=2 * RATE)
            await reader.send("long", LONG_TEXT, False,  # ~22 MB of audio: far more than socket buffers hold
                              output_format={"container": "raw", "encoding": "pcm_f32le", "sample_rate": 2 * RATE})
            sent = time.monotonic()
            while time.monotonic() - sent < 2.5:
                await reader.receive()
                await asyncio.sleep(0.05)
            read_slowly = len(reader.results["long"].audio)
            await reader.until_ended("long")
            ended = time.monotonic()
            error, code = await closed_when_idle(ws)
            return reader, read_slowly, time.monotonic() - ended, error, code

    async def run():
        return await asyncio.gather(silent(), chatty(), slow_reader())

    try:
        (error, code, waited), chat, slow = asyncio.run(run())
    finally:
        server.stop()
    reader, read_slowly, idle_after_end, reader_error, reader_code = slow
    assert error["type"] == "error" and error["code"] == "idle_timeout" and error["context_id"] is None, error
    assert error["done"] is False and code == 1000 and 1.0 <= waited < 5, (error, code, waited)
    assert None not in chat.results and all(m["type"] != "error" for r in chat.results.values() for m in r.messages)
    check_context(chat.results["last"])
    long = reader.results["long"]
    assert [m["type"] for m in long.messages].count("done") == 1 and long.end["type"] == "done", long.messages[-3:]
    assert len(long.audio) / 4 / (2 * RATE) > 40  # the whole text (f32 samples), not cut
    # what was left after the slow reads exceeds what loopback socket buffers hold (Linux: 4 MiB sent, 16 KiB
    # received here), so the context was still sending well past the timeout
    assert len(long.audio) - read_slowly > 8 << 20, (len(long.audio), read_slowly)
    assert reader_error["code"] == "idle_timeout" and reader_code == 1000 and idle_after_end >= 0.9


def test_closing_the_socket_cancels_its_contexts(server):
    async def run() -> None:
        async with connect(server) as ws:
            socket = Socket(ws)
            await socket.send("open", LONG_TEXT, True)  # input never ends
            await socket.send("ended", LONG_TEXT, False)
            while not (socket.results["open"].audio and socket.results["ended"].audio):
                await socket.receive()

    asyncio.run(run())
    assert active_requests(server) == 0


def test_whitespace_context_is_done_without_audio_and_ids_are_reusable(server):
    async def run() -> Socket:
        async with connect(server) as ws:
            socket = Socket(ws)
            await socket.send("empty", " ", True)
            await socket.send("empty", "  ", False)
            await socket.until_ended("empty")
            await socket.send("reused", "First.", False)
            await socket.until_ended("reused")
            first = bytes(socket.results["reused"].audio)
            socket.results["reused"] = Result()
            await socket.send("reused", "First.", False)
            await socket.until_ended("reused")
            assert bytes(socket.results["reused"].audio) == first
            return socket

    socket = asyncio.run(run())
    assert [m["type"] for m in socket.results["empty"].messages] == ["done"]


def test_a_second_flush_of_an_ended_context_changes_nothing(server):
    async def run() -> Socket:
        async with connect(server) as ws:
            socket = Socket(ws)
            await socket.send("twice", LONG_TEXT, True)
            await socket.send("twice", "", False)
            while not socket.results["twice"].audio:
                await socket.receive()
            await socket.send("twice", "", False)  # again, while its audio streams
            await socket.send("closed", LONG_TEXT, False)
            await socket.send("closed", "More text.", False)  # text after the end (still speaking) is an error
            await socket.until_ended("twice", "closed")
            return socket

    socket = asyncio.run(run())
    check_context(socket.results["twice"])
    assert not [m for m in socket.results["twice"].messages if m["type"] == "error"]
    assert len(socket.results["twice"].audio) / 2 / RATE > 0.8 * len(LONG_TEXT.split()) / 3.5
    assert [m.get("code") for m in socket.results["closed"].messages if m["type"] == "error"] == ["context_closed"]


def test_separate_messages_are_never_glued_into_one_word(server):
    async def run() -> tuple[Result, Result]:
        glued = await solo(server, ["Hel", "lo", " there."])
        separate = await solo(server, ["Hello", "there."], max_buffer_delay_ms=0)
        return glued, separate

    glued, separate = asyncio.run(run())
    assert [w for w, _, _ in glued.words] == ["Hello", "there."]
    assert [w for w, _, _ in separate.words] == ["Hello", "there."]


def test_speed_sample_rate_volume_and_encodings(server):
    def seconds(result: Result, rate: int = RATE) -> float:
        return len(result.audio) / 2 / rate

    async def run() -> dict[str, Result]:
        text = ["The train to the coast leaves at nine."]
        results = {"plain": await solo(server, text),
                   "fast": await solo(server, text, generation_config={"speed": 2.0}),
                   "quiet": await solo(server, text, generation_config={"volume": 0.5})}
        async with connect(server) as ws:
            socket = Socket(ws, rate=16000)
            await socket.send("16k", text[0], False,
                              output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000})
            await socket.until_ended("16k")
            results["16k"] = socket.results["16k"]
        return results

    results = asyncio.run(run())
    plain = seconds(results["plain"])
    assert abs(seconds(results["fast"]) - plain / 2) < 0.15 * plain
    assert abs(seconds(results["16k"], 16000) - plain) < 0.02
    loud = np.abs(np.frombuffer(bytes(results["plain"].audio), "<i2")).max()
    quiet = np.abs(np.frombuffer(bytes(results["quiet"].audio), "<i2")).max()
    assert abs(quiet / loud - 0.5) < 0.02
    # timings follow the audio they describe: at double speed, within the shorter audio
    assert results["fast"].words[-1][2] <= seconds(results["fast"]) + 1e-3


def test_bytes_formats_and_errors(server):
    def post(**body) -> httpx.Response:
        payload = {k: v for k, v in SETTINGS.items() if k != "add_timestamps"}
        return httpx.post(f"{server.url}/tts/bytes", headers={"X-API-Key": KEY, "Cartesia-Version": "2026-03-01"},
                          json={**payload, "transcript": "Tea, coffee, or water?", **body}, timeout=60)

    s16 = post()
    assert s16.status_code == 200 and s16.headers["x-sample-rate"] == str(RATE)
    samples = len(s16.content) // 2
    f32 = post(output_format={"container": "raw", "encoding": "pcm_f32le", "sample_rate": RATE})
    mulaw = post(output_format={"container": "raw", "encoding": "pcm_mulaw", "sample_rate": RATE})
    wav = post(output_format={"container": "wav", "encoding": "pcm_s16le", "sample_rate": RATE})
    assert len(f32.content) == 4 * samples and len(mulaw.content) == samples
    np.testing.assert_allclose(np.frombuffer(f32.content, "<f4"), np.frombuffer(s16.content, "<i2") / 32767,
                               atol=1e-4)
    assert wav.content[:4] == b"RIFF" and wav.content[44:] == s16.content
    bad = post(voice={"mode": "id", "id": "nobody"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "voice.id"
    assert post(transcript="  ").status_code == 400
    assert post(language="zh", transcript="你好").status_code == 200  # eSpeak's Mandarin is "cmn"
    assert post(add_timestamps=True).json()["error"]["param"] == "add_timestamps"
    assert post(output_format={"container": "mp4"}).status_code == 400
    # a nested field of the wrong type, or unknown, is named by its whole path
    for body, param in (({"output_format": {"sample_rate": "24000"}}, "output_format.sample_rate"),
                        ({"output_format": {"encoding": 5}}, "output_format.encoding"),
                        ({"output_format": {"colour": 1}}, "output_format.colour"),
                        ({"generation_config": {"speed": "fast"}}, "generation_config.speed"),
                        ({"generation_config": {"emotion": 1}}, "generation_config.emotion"),
                        ({"voice": {"mode": "id", "id": 7}}, "voice.id"),
                        ({"voice": {"mode": 1}}, "voice.mode")):
        error = post(**body).json()["error"]
        assert error["param"] == param and f"'{param}'" in error["message"], (body, error)
    embedding = post(voice={"mode": "embedding", "embedding": [0.0] * 192}).json()["error"]
    assert embedding["code"] == "embedding_unsupported" and '"id": ...} with' in embedding["message"], embedding


def test_every_key_source_and_any_version(server):
    async def handshake(query: str, headers: dict) -> str:
        try:
            async with connect(server, query, headers) as ws:
                socket = Socket(ws)
                await socket.send("k", "Hi.", False)
                await socket.until_ended("k")
                return socket.results["k"].end["type"]
        except websockets.InvalidStatus as refused:
            return str(refused.response.status_code)

    async def run() -> list[str]:
        return [await handshake("?cartesia_version=2025-04-16", {"X-API-Key": KEY}),
                await handshake("", {"Authorization": f"Bearer {KEY}", "Cartesia-Version": "1999-01-01"}),
                await handshake(f"?api_key={KEY}&cartesia_version=2026-03-01", {}),
                await handshake("", {}),
                await handshake("?api_key=wrong", {"X-API-Key": "wrong"})]

    assert asyncio.run(run()) == ["done", "done", "done", "403", "403"]
    body = {"transcript": "Hi.", "voice": {"mode": "id", "id": "alloy"}}
    assert httpx.post(f"{server.url}/tts/bytes?api_key={KEY}", json=body, timeout=30).status_code == 200
    refused = httpx.post(f"{server.url}/tts/bytes", json=body, timeout=30)
    assert refused.status_code == 401 and "X-API-Key" in refused.json()["error"]["message"]
    # X-API-Key is Cartesia's: the OpenAI routes keep to their own
    assert httpx.get(f"{server.url}/v1/models", headers={"X-API-Key": KEY}).status_code == 401


def test_origin_rules_and_no_key_in_the_access_log(tmp_path):
    log_path = tmp_path / "server.log"
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port),
                                    "--log-level", "info", "--api-key", KEY], stdout=log, stderr=subprocess.STDOUT)
    server = Server(process, port, KEY)
    try:
        server.wait_healthy()

        async def status(origin: str) -> int:
            try:
                async with connect(server, f"?api_key={KEY}&cartesia_version=x", {"Origin": origin}):
                    return 101
            except websockets.InvalidStatus as refused:
                return refused.response.status_code

        async def run() -> list[int]:
            return [await status(f"http://127.0.0.1:{port}"), await status("http://evil.example")]

        assert asyncio.run(run()) == [101, 403]
        body = {"transcript": "Hi.", "voice": {"mode": "id", "id": "alloy"}}
        assert httpx.post(f"{server.url}/tts/bytes?api_key={KEY}", json=body, timeout=30).status_code == 200
    finally:
        server.stop()
    log = log_path.read_text()
    assert "/tts/websocket?cartesia_version=x" in log and "/tts/bytes" in log, log[-2000:]
    assert KEY not in log

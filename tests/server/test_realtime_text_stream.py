"""`WS /v1/audio/speech/stream` with a plain `websockets` client, on a real server."""

from __future__ import annotations

import asyncio
import json
import time

import websockets

from tests.helpers.audio import estimate_duration
from tests.helpers.realtime_clients import reference_pcm

LLM_TEXT = ("Sure, here is the plan for today. First we walk to the harbor, then we take the ferry across, "
            "and in the afternoon we visit the old lighthouse before dinner.")


class StreamClient:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, server) -> StreamClient:
        ws = await websockets.connect(f"{server.ws_url}/v1/audio/speech/stream", additional_headers=server.headers())
        return cls(ws)

    async def send(self, **event) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self, timeout: float = 20.0) -> dict | bytes:
        message = await asyncio.wait_for(self.ws.recv(), timeout)
        return message if isinstance(message, bytes) else json.loads(message)

    async def error(self) -> dict:
        message = await self.recv()
        assert isinstance(message, dict) and message["type"] == "error", message
        return message

    async def utterance(self) -> tuple[dict, bytes, dict]:
        """audio.start, the PCM of its binary frames, audio.done."""
        start = await self.recv()
        assert isinstance(start, dict) and start["type"] == "audio.start", start
        pcm = bytearray()
        while True:
            message = await self.recv()
            if isinstance(message, bytes):
                pcm += message
                continue
            assert message["type"] == "audio.done", message
            assert message["utterance_index"] == start["utterance_index"]
            assert message["total_bytes"] == len(pcm)
            return start, bytes(pcm), message


def test_llm_like_feed_gets_audio_before_input_done(espeak_server):
    async def run():
        client = await StreamClient.connect(espeak_server)
        await client.send(type="session.config", voice="nova", sample_rate=24000)
        first_audio_at: list[float] = []
        frames: list[dict | bytes] = []

        async def receive():
            while True:
                message = await client.recv()
                if isinstance(message, bytes) and not first_audio_at:
                    first_audio_at.append(time.monotonic())
                frames.append(message)
                if isinstance(message, dict) and message["type"] == "audio.done":
                    return

        receiver = asyncio.create_task(receive())
        for word in LLM_TEXT.split(" "):
            await client.send(type="input.text", text=word + " ")
            await asyncio.sleep(0.05)
        done_sent_at = time.monotonic()
        await client.send(type="input.done")
        await asyncio.wait_for(receiver, 30)
        await client.ws.close()
        return first_audio_at, done_sent_at, frames

    first_audio_at, done_sent_at, frames = asyncio.run(run())
    assert first_audio_at and first_audio_at[0] < done_sent_at  # audio flowed while the text was still coming
    start, done = frames[0], frames[-1]
    assert start == {"type": "audio.start", "utterance_index": 0, "format": "pcm", "sample_rate": 24000,
                     "channels": 1}
    pcm = b"".join(f for f in frames if isinstance(f, bytes))
    assert done == {"type": "audio.done", "utterance_index": 0, "total_bytes": len(pcm), "reason": "stop"}
    # fed word by word, the model still speaks the same clauses: the audio equals the whole text spoken alone
    assert pcm == reference_pcm(espeak_server, LLM_TEXT + " ", "nova")


def test_utterances_one_after_another_are_isolated(espeak_server):
    texts = ["The first answer is short.", "The second one, said right after, is a little bit longer."]

    async def run():
        client = await StreamClient.connect(espeak_server)
        await client.send(type="session.config", voice="onyx", sample_rate=16000)
        for text in texts:  # the second utterance's text arrives while the first is still being spoken
            await client.send(type="input.text", text=text)
            await client.send(type="input.done")
        results = [await client.utterance() for _ in texts]
        await client.send(type="session.config", voice="coral")  # between utterances: allowed
        await client.send(type="input.text", text=texts[0])
        await client.send(type="input.done")
        results.append(await client.utterance())
        await client.send(type="session.close")
        try:
            await client.recv(5)
        except websockets.ConnectionClosedOK as closed:
            assert closed.rcvd.code == 1000
        return results

    results = asyncio.run(run())
    assert [start["utterance_index"] for start, _, _ in results] == [0, 1, 2]
    assert results[0][0]["sample_rate"] == 16000 and results[2][0]["sample_rate"] == 24000
    assert results[0][1] == reference_pcm(espeak_server, texts[0], "onyx", 16000)
    assert results[1][1] == reference_pcm(espeak_server, texts[1], "onyx", 16000)
    assert results[2][1] == reference_pcm(espeak_server, texts[0], "coral", 24000)


def test_input_cancel_stops_the_utterance_and_the_next_one_works(espeak_server):
    long_text = " ".join(["This is a long utterance that the listener interrupts."] * 30)

    async def run():
        client = await StreamClient.connect(espeak_server)
        await client.send(type="input.text", text=long_text)
        await client.send(type="input.done")
        assert (await client.recv())["type"] == "audio.start"
        assert isinstance(await client.recv(), bytes)
        await client.send(type="input.cancel")
        received = 0
        while True:
            message = await client.recv()
            if isinstance(message, bytes):
                received += len(message)
                continue
            break
        assert message["type"] == "audio.done" and message["reason"] == "cancelled"
        await client.send(type="input.text", text="Okay.")
        await client.send(type="input.done")
        start, pcm, done = await client.utterance()
        await client.ws.close()
        return message, start, pcm, done

    cancelled, start, pcm, done = asyncio.run(run())
    assert cancelled["total_bytes"] < estimate_duration(long_text) * 48000 / 4
    assert start["utterance_index"] == 1 and done["reason"] == "stop"
    assert pcm == reference_pcm(espeak_server, "Okay.", "alloy")


def test_sentence_split_mode(espeak_server):
    async def run():
        client = await StreamClient.connect(espeak_server)
        await client.send(type="session.config", text_split="sentence")
        for piece in ["One sentence here. And ", "a second one! A third", " without an end"]:
            await client.send(type="input.text", text=piece)
        await client.send(type="input.done")
        start, pcm, done = await client.utterance()
        await client.ws.close()
        return pcm, done

    pcm, done = asyncio.run(run())
    assert done["reason"] == "stop"
    text = "One sentence here. And a second one! A third without an end"
    assert abs(len(pcm) / 48000 - estimate_duration(text)) < 0.4 * estimate_duration(text)
    # Each sentence is a request of its own, resampled by the engine core: the utterance is their solo clips.
    sentences = ["One sentence here.", "And a second one!", "A third without an end"]
    assert pcm == b"".join(reference_pcm(espeak_server, sentence, None) for sentence in sentences)


def test_bad_messages_get_errors_and_the_session_survives(espeak_server):
    async def run():
        client = await StreamClient.connect(espeak_server)
        bystander = await StreamClient.connect(espeak_server)
        await bystander.send(type="input.text", text=LLM_TEXT)
        await bystander.send(type="input.done")
        codes = []
        for frame in ["{oops", "42", json.dumps({"type": "input.fly"}), b"\x00\x01",
                      json.dumps({"type": "input.done"}),
                      json.dumps({"type": "input.text", "text": 5}),
                      json.dumps({"type": "input.text", "text": "x" * 70000}),
                      json.dumps({"type": "session.config", "response_format": "mp3"}),
                      json.dumps({"type": "session.config", "voice": "nobody"}),
                      json.dumps({"type": "session.config", "sample_rate": 1}),
                      json.dumps({"type": "session.config", "text_split": "words"}),
                      json.dumps({"type": "session.config", "bogus": 1}),
                      json.dumps({"type": "input.text", "text": "a" * (15 * 1024 * 1024 + 1)})]:
            await client.ws.send(frame)
            codes.append((await client.error())["code"])
        assert codes == ["invalid_json", "invalid_event", "unknown_event_type", "invalid_frame", "no_open_utterance",
                         "invalid_value", "text_too_long", "invalid_value", "invalid_value", "invalid_value",
                         "invalid_value", "unknown_parameter", "event_too_large"]
        await client.send(type="input.text", text="Open now.")
        await client.send(type="session.config", voice="nova")
        # The utterance's audio.start may come before or after the error: both are answers to what was sent.
        early = []
        while not (isinstance(message := await client.recv(), dict) and message["type"] == "error"):
            early.append(message)
        assert message["code"] == "utterance_open", message
        await client.send(type="input.done")
        if not early:
            early.append(await client.recv())
        assert early[0]["type"] == "audio.start"
        pcm = b"".join(m for m in early[1:] if isinstance(m, bytes))
        while not (isinstance(message := await client.recv(), dict) and message["type"] == "audio.done"):
            if isinstance(message, bytes):
                pcm += message
        assert message["reason"] == "stop" and pcm == reference_pcm(espeak_server, "Open now.", "alloy")
        _, other, _ = await bystander.utterance()
        assert other == reference_pcm(espeak_server, LLM_TEXT, "alloy")
        await client.ws.close()
        await bystander.ws.close()

    asyncio.run(run())

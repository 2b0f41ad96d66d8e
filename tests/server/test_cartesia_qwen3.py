"""Cartesia's `WS /tts/websocket` on a tiny random Qwen3-TTS Base checkpoint: embedding voices (x-vectors), and a
context whose audio ends (the model's 64-frame limit) while its input is still open."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import websockets

from benchmarks.build_tiny_qwen3 import build
from tests.helpers.cartesia_client import Result, Socket, active_requests
from tests.helpers.server import start_server

LONG_TEXT = ("Good morning, and welcome aboard. The train to the coast leaves at nine. Please mind the gap, and "
             "hold the rail. Tea, coffee, or water, sir? It rained all night; the roads are wet. ") * 4


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    model = build(tmp_path_factory.mktemp("cartesia-base") / "tiny-base", "base", seed=22)
    server = start_server("--model", str(model))
    server.model = model
    yield server
    server.stop()


@pytest.mark.timeout(1200)
def test_qwen3_base_takes_an_x_vector_of_its_size(base_server):
    size = json.loads((Path(base_server.model) / "config.json").read_text())["speaker_encoder_config"]["enc_dim"]

    async def run() -> Socket:
        async with websockets.connect(f"{base_server.ws_url}/tts/websocket") as ws:
            socket = Socket(ws)
            embedding = np.random.default_rng(0).standard_normal(size).tolist()
            await socket.send("xv", "Hello there,", True, voice={"mode": "embedding", "embedding": embedding},
                              language="en")
            await socket.send("xv", " friend.", False)
            await socket.send("short", "Hi.", False, voice={"mode": "embedding", "embedding": [0.0] * (size - 1)})
            await socket.send("id", "Hi.", False, voice={"mode": "id", "id": "alloy"})
            await socket.until_ended("xv", "short", "id")
            return socket

    socket = asyncio.run(run())
    xv = socket.results["xv"]
    assert xv.end["type"] == "done" and len(xv.audio) > 0
    assert socket.results["short"].end["param"] == "voice.embedding"
    assert f"{size} numbers" in socket.results["short"].end["error"]
    assert socket.results["id"].end["param"] == "voice.id"  # a Base checkpoint has no built-in voices


def test_a_context_whose_audio_ends_first_drops_its_later_text_and_is_done_at_its_end(base_server):
    """The tiny model stops after 64 frames (or earlier, at random); its input is still open then."""
    size = json.loads((Path(base_server.model) / "config.json").read_text())["speaker_encoder_config"]["enc_dim"]
    voice = {"mode": "embedding", "embedding": [0.01] * size}

    async def run() -> tuple[Result, int]:
        async with websockets.connect(f"{base_server.ws_url}/tts/websocket") as ws:
            socket = Socket(ws)
            await socket.send("capped", LONG_TEXT, True, voice=voice)
            while not socket.results["capped"].audio:
                await socket.receive()
            reader = asyncio.create_task(socket.until_ended("capped"))
            # its request ends while its input is open
            assert await asyncio.to_thread(active_requests, base_server, 300) == 0
            await asyncio.sleep(1)  # its last audio reaches the client
            assert not reader.done()
            reader.cancel()
            await asyncio.wait([reader])
            heard = len(socket.results["capped"].messages)
            await socket.send("capped", " More text that has no audio.", True)
            await socket.send("capped", "", False)
            await socket.until_ended("capped")
            return socket.results["capped"], heard

    result, heard = asyncio.run(run())
    assert [m["type"] for m in result.messages[heard:]] == ["done"]

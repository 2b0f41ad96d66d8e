"""`/v1/realtime` with `"streamvox": {"word_timestamps": true}`: one transcript delta per word with its
`start_time`, and `conversation.item.truncate` cutting the transcript (and so the thinker's history) at a word."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streamvox.contract import ModelInfo
from streamvox.server.errors import APIError
from streamvox.server.realtime.protocol import parse_streamvox_options
from tests.helpers.realtime_clients import DELTA_TYPES, RealtimeClient, answered
from tests.helpers.server import Server, free_port, start_server
from tests.helpers.tiny_models import build_tiny_qwen3

ROOT = Path(__file__).resolve().parents[3]
TEXT = "Good morning. The train to the coast leaves at 9:45, so pack light and bring a coat."
TRANSCRIPT_DELTAS = {"response.output_audio_transcript.delta", "response.audio_transcript.delta"}
TRANSCRIPT_DONE = {"response.output_audio_transcript.done", "response.audio_transcript.done"}
WORD_TIMESTAMPS = {"streamvox": {"word_timestamps": True}}


def word_deltas(events: list[dict], bytes_per_second: int) -> tuple[list[dict], str]:
    """The transcript deltas of a response and its transcript, checked: each delta after audio, its start_time
    monotone and within the audio sent before it, the deltas concatenating to the transcript."""
    audio_s, deltas, last = 0.0, [], -1.0
    for event in events:
        if event["type"] in DELTA_TYPES:
            audio_s += len(base64.b64decode(event["delta"])) / bytes_per_second
        elif event["type"] in TRANSCRIPT_DELTAS:
            assert audio_s > 0, "a transcript delta before the first audio"
            start = event["start_time"]
            assert last <= start <= audio_s + 1e-3, (last, start, audio_s)
            last = start
            deltas.append(event)
    transcript = next(e for e in events if e["type"] in TRANSCRIPT_DONE)["transcript"]
    assert "".join(e["delta"] for e in deltas) == transcript
    assert [e["delta"].strip() for e in deltas] == transcript.split()  # one delta a word
    return deltas, transcript


async def truncate(client: RealtimeClient, item_id: str, audio_end_ms: int) -> str:
    """Truncate the item's audio; its transcript afterwards."""
    await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                       "audio_end_ms": audio_end_ms})
    assert (await client.expect("conversation.item.truncated"))["audio_end_ms"] == audio_end_ms
    await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
    return (await client.expect("conversation.item.retrieved"))["item"]["content"][0]["transcript"]


def cut_after(deltas: list[dict], k: int) -> tuple[int, str]:
    """An `audio_end_ms` just after word k starts, and what the listener heard by then (words 0..k)."""
    return round(deltas[k]["start_time"] * 1000) + 1, "".join(e["delta"] for e in deltas[:k + 1])


@pytest.mark.parametrize(("beta", "session"), [
    (False, {"type": "realtime", "audio": {"output": {"speed": 1.25}}}),
    (True, {"output_audio_format": "g711_ulaw"}),
], ids=["ga-speed", "beta-g711"])
def test_one_transcript_delta_per_word(espeak_server, beta, session):
    async def run():
        client = await RealtimeClient.connect(espeak_server, beta=beta)
        assert client.session["streamvox"]["word_timestamps"] is False
        await client.send({"type": "session.update", "session": {**session, **WORD_TIMESTAMPS}})
        assert (await client.expect("session.updated"))["session"]["streamvox"]["word_timestamps"] is True
        events = await client.say(TEXT, instructions=TEXT)
        assert events[-1]["response"]["status"] == "completed"
        deltas, transcript = word_deltas(events, 8000 if beta else 48000)
        assert transcript == TEXT and len(deltas) == len(TEXT.split())
        assert deltas[0]["start_time"] == 0.0 and deltas[0]["delta"] == "Good"
        assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == TEXT
        await client.close()

    asyncio.run(run())


def test_truncate_cuts_the_transcript_at_a_word(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        events = await client.say(TEXT)  # no word timestamps: upstream drops the transcript
        item_id = events[-1]["response"]["output"][0]["id"]
        assert await truncate(client, item_id, 500) == ""

        await client.send({"type": "session.update", "session": WORD_TIMESTAMPS})
        await client.expect("session.updated")
        events = await client.say(TEXT)
        deltas, transcript = word_deltas(events, 48000)
        item_id = events[-1]["response"]["output"][0]["id"]
        audio_ms = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] in DELTA_TYPES) // 48
        assert await truncate(client, item_id, audio_ms) == TEXT  # all of it heard
        audio_end_ms, heard = cut_after(deltas, 7)
        assert heard == "Good morning. The train to the coast leaves"
        assert await truncate(client, item_id, audio_end_ms) == heard
        assert await truncate(client, item_id, 0) == ""  # no word had started
        await client.close()

    asyncio.run(run())


def test_cancelled_response_keeps_the_words_spoken(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "session.update", "session": WORD_TIMESTAMPS})
        await client.expect("session.updated")
        long_text = " ".join([TEXT] * 20)
        await client.send({"type": "response.create", "response": {"instructions": long_text}})
        events = await client.until("response.output_audio_transcript.delta")
        await client.send({"type": "response.cancel"})
        events += await client.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        deltas, transcript = word_deltas(events, 48000)
        assert deltas and long_text.startswith(transcript) and long_text[len(transcript)] == " "
        assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == transcript
        await client.close()

    asyncio.run(run())


def test_a_response_cancelled_mid_clause_keeps_the_words_heard(espeak_server):
    """Timings come word by word, not at the clause's end: a barge-in inside a long clause still leaves the
    transcript (and so the thinker's history) the words whose audio went out."""
    clause = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
              "seventeen eighteen nineteen twenty")

    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "session.update", "session": WORD_TIMESTAMPS})
        await client.expect("session.updated")
        await client.send({"type": "response.create", "response": {"instructions": clause}})
        events, audio_s = [], 0.0
        while audio_s < 1.5:  # of the clause's six seconds
            events.append(event := await client.recv())
            if event["type"] in DELTA_TYPES:
                audio_s += len(base64.b64decode(event["delta"])) / 48000
        await client.send({"type": "response.cancel"})
        events += await client.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        deltas, transcript = word_deltas(events, 48000)
        sent_s = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] in DELTA_TYPES) / 48000
        assert sent_s < 5.0, "the whole clause was spoken before the cancel"
        assert len(deltas) >= 3 and clause.startswith(transcript) and clause[len(transcript)] == " "
        await client.close()

    asyncio.run(run())


def test_bad_word_timestamps_option(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        for streamvox, param in (({"word_timestamps": "yes"}, "session.streamvox.word_timestamps"),
                                 ({"word_timestamps": 1}, "session.streamvox.word_timestamps"),
                                 (True, "session.streamvox")):
            await client.send({"type": "session.update", "event_id": "u1",
                               "session": {"type": "realtime", "streamvox": streamvox}})
            events = await client.until("error")
            error = events[-1]["error"]
            assert (error["type"], error["code"], error["param"], error["event_id"]) == (
                "invalid_request_error", "invalid_value", param, "u1"), error
        await client.send({"type": "session.update", "session": {"type": "realtime"}})
        updated = (await client.until("session.updated"))[-1]
        assert updated["session"]["streamvox"]["word_timestamps"] is False
        events = await client.say(TEXT)
        assert [e["delta"] for e in events if e["type"] in TRANSCRIPT_DELTAS] == [TEXT]  # today's one delta
        await client.close()

    asyncio.run(run())


def test_word_timestamps_option_needs_timings():
    info = ModelInfo(name="tiny", family="qwen3_tts", sample_rate=24000, voices=["a"], default_voice="a")
    with pytest.raises(APIError) as refused:
        parse_streamvox_options({"word_timestamps": True}, info)
    assert refused.value.code == "word_timestamps_unavailable"
    assert refused.value.param == "session.streamvox.word_timestamps"
    assert "--aligner pocketsphinx" in refused.value.message
    assert parse_streamvox_options({"word_timestamps": False, "responder": "echo"}, info) == {
        "word_timestamps": False}
    assert parse_streamvox_options({"engine_model": "tiny"}, info) == {}


# the thinker: an OpenAI-compatible chat server (tests/helpers/tiny_chat_server.py) behind --llm-url


def _vllm_python() -> str:
    python = Path(os.environ.get("STREAMVOX_VLLM_VENV", ROOT / ".vllm-venv")) / "bin" / "python"
    if not python.exists():
        pytest.fail(f"The vLLM virtualenv (it runs the tiny chat server) is missing at {python.parents[1]}; create it "
                    "with scripts/setup_vllm_venv.sh DIR (or set STREAMVOX_VLLM_VENV).", pytrace=False)
    return str(python)


@pytest.fixture(scope="module")
def thinker_server(tmp_path_factory) -> Iterator[tuple[Server, str]]:
    """(a server whose thinker is the tiny chat server, the chat server's URL)."""
    model = build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-qwen3")
    port = free_port()
    chat = subprocess.Popen([_vllm_python(), str(ROOT / "tests" / "helpers" / "tiny_chat_server.py"), str(model),
                             str(port)], cwd=ROOT)
    chat_url = f"http://127.0.0.1:{port}"
    server = None
    try:
        server = start_server("--llm-url", f"{chat_url}/v1", "--llm-model", "tiny-qwen3", "--llm-max-tokens", "80",
                              "--llm-temperature", "1.0", "--llm-seed", "1")
        deadline = time.monotonic() + 300
        while True:
            assert chat.poll() is None, "the tiny chat server exited"
            try:
                if httpx.get(f"{chat_url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the tiny chat server did not start"
            time.sleep(0.2)
        yield server, chat_url
    finally:
        if server is not None:
            server.stop()
        chat.terminate()
        chat.wait(10)


def test_thinker_history_holds_the_words_heard(thinker_server):
    server, chat_url = thinker_server

    async def run():
        client = await RealtimeClient.connect(server)
        await client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be terse.",
                                                                 **WORD_TIMESTAMPS}})
        await client.expect("session.updated")
        events = await client.say("Hello, who are you?")
        assert answered(events[-1]["response"]), events[-1]["response"]
        deltas, transcript = word_deltas(events, 48000)
        assert len(deltas) >= 4, transcript  # the seeded random thinker says a few words
        item_id = events[-1]["response"]["output"][0]["id"]
        audio_end_ms, heard = cut_after(deltas, len(deltas) // 2)
        assert await truncate(client, item_id, audio_end_ms) == heard
        assert transcript.startswith(heard) and transcript[len(heard)].isspace()
        print(f"the thinker said {transcript!r} ({len(deltas)} words); heard: {heard!r}")

        await client.say("Go on.")
        messages = httpx.get(f"{chat_url}/stats", timeout=5).json()["last_messages"]
        assert messages == [{"role": "system", "content": "Be terse."},
                            {"role": "user", "content": "Hello, who are you?"},
                            {"role": "assistant", "content": heard},
                            {"role": "user", "content": "Go on."}]
        await client.close()

    asyncio.run(run())

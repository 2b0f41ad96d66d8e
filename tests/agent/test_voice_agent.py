"""The voice agent on /v1/realtime: thinker LLM -> streaming talker, ASR of audio turns, server VAD, barge-in.

Real servers, real clients (the `openai` SDK's realtime client), real models of the real architectures with random
weights (built in tests/helpers/tiny_models.py, nothing downloaded). Random weights say gibberish, so these tests
check the event flow, timing and state, never what is said.

vLLM runs from its own virtualenv (scripts/setup_vllm_venv.sh DIR; STREAMVOX_VLLM_VENV, default .vllm-venv in the
repository). The tests fail, with the command to run, when it is missing.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from streamvox.agent.history import truncate_history
from tests.helpers.realtime_clients import answered
from tests.helpers.server import Server, free_port
from tests.helpers.tiny_models import build_tiny_qwen3, build_tiny_whisper

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("STREAMVOX_VLLM_VENV", ROOT / ".vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
# A bound, not the expected time: each vLLM CPU engine spawns 2 processes that both import vLLM.
START_TIMEOUT_S = 600

pytestmark = pytest.mark.timeout(START_TIMEOUT_S + 180)

AUDIO_DELTAS = {"response.output_audio.delta"}
TRANSCRIPT_DELTAS = {"response.output_audio_transcript.delta"}


def run_async(test):
    """Run an async test function in its own event loop (the suite has no asyncio plugin)."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return wrapper


def vllm_python() -> str:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"The vLLM virtualenv is missing at {VLLM_VENV}. Create it with "
                    f"`bash scripts/setup_vllm_venv.sh {VLLM_VENV}` (or set STREAMVOX_VLLM_VENV).", pytrace=False)
    return str(VLLM_PYTHON)


def spawn(python: str, *args: str) -> Server:
    port = free_port()
    command = [python, "-m", "streamvox.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    # A session of its own: teardown can end whatever the server left (vLLM engine processes outlive a killed
    # parent).
    return Server(subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True), port)


def stop_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def speech_pcm(server: Server, text: str) -> bytes:
    """`text` spoken by the default espeak voice, PCM16 at 24 kHz (what a client's microphone would send)."""
    response = httpx.post(f"{server.url}/v1/audio/speech", timeout=60,
                          json={"input": text, "response_format": "pcm", "sample_rate": 24000})
    response.raise_for_status()
    return response.content


def silence(seconds: float) -> bytes:
    return bytes(int(24000 * seconds) * 2)


def sdk(server: Server) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", base_url=f"{server.url}/v1", websocket_base_url=f"{server.ws_url}/v1")


async def append_audio(conn, pcm: bytes, chunk_s: float = 0.1) -> None:
    step = int(24000 * chunk_s) * 2
    for start in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + step]).decode())


async def events_until(conn, event_type: str, timeout: float = 120.0, on_event=None) -> list:
    """Every server event (as a dict) up to and including the first `event_type`."""
    events = []

    async def read():
        async for event in conn:
            data = event.model_dump(exclude_unset=False)
            events.append(data)
            if on_event is not None:
                await on_event(data)
            if data["type"] == "error":
                raise AssertionError(f"server error event: {data}")
            if data["type"] == event_type:
                return

    await asyncio.wait_for(read(), timeout)
    return events


def types(events: list) -> list[str]:
    return [e["type"] for e in events]


def check_response_flow(events: list) -> dict:
    """Audio and transcript deltas were streamed, and the first audio came before the thinker finished."""
    names = types(events)
    done = events[-1]
    assert done["type"] == "response.done", names
    assert answered(done["response"]), done["response"]
    audio = [i for i, n in enumerate(names) if n in AUDIO_DELTAS]
    text = [i for i, n in enumerate(names) if n in TRANSCRIPT_DELTAS]
    assert audio and len(text) >= 3, names
    extra = done["response"]["streamvox"]
    timings = extra["timings_ms"]
    assert extra["thinker"]["state"] == "finished"
    # Speech started while the thinker was still generating: on the wire (an audio delta before the last
    # transcript delta) and by the server's clock.
    assert audio[0] < text[-1], names
    assert timings["first_audio"] < timings["thinker_done"], timings
    transcript = "".join(events[i]["delta"] for i in text)
    assert names.count("response.output_audio_transcript.done") == 1
    spoken = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert spoken == transcript.strip()
    # usage: the thinker's deltas out as text, the talker's deltas out as audio
    usage = sent(done["response"]["usage"])
    assert usage == expected_usage(usage["input_tokens"], len(text), len(audio)), usage
    assert usage["input_tokens"] > 0
    return timings


def sent(fields: dict) -> dict:
    """`fields` without the None values the SDK's models add for fields the server did not send."""
    return {k: sent(v) if isinstance(v, dict) else v for k, v in fields.items() if v is not None}


def expected_usage(input_text: int, output_text: int, output_audio: int) -> dict:
    return {"total_tokens": input_text + output_text + output_audio, "input_tokens": input_text,
            "output_tokens": output_text + output_audio,
            "input_token_details": {"text_tokens": input_text, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": output_text, "audio_tokens": output_audio}}


# unit tests: history budget


def test_history_is_truncated_to_the_budget():
    count = lambda text: len(text.split())  # noqa: E731
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(10):
        messages += [{"role": "user", "content": f"question {i} " * 5}, {"role": "assistant", "content": "ok " * 5}]
    kept = truncate_history(messages, 60, count)
    assert kept[0]["role"] == "system" and kept[1]["role"] == "user"
    assert kept[-1] == messages[-1]
    assert sum(count(m["content"]) + 4 for m in kept) <= 60
    assert len(kept) < len(messages)
    huge = [{"role": "user", "content": "word " * 1000}]
    assert count(truncate_history(huge, 50, count)[0]["content"]) <= 50


# --llm-url: an external OpenAI-compatible endpoint


@dataclass
class Launched:
    chat_url: str
    chat: subprocess.Popen  # tests/helpers/tiny_chat_server.py
    url_agent: Server  # streamvox from the main venv, --llm-url
    vllm_agent: Server  # streamvox from the vLLM venv, --llm and --asr
    t0: float


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Iterator[Launched]:
    """Every server starts at once (vLLM's engines take most of the time); each test waits for what it uses."""
    python = vllm_python()
    root = tmp_path_factory.mktemp("models")
    qwen3, whisper = build_tiny_qwen3(root / "tiny-qwen3"), build_tiny_whisper(root / "tiny-whisper")
    t0 = time.monotonic()
    vllm_agent = spawn(python, "--llm", str(qwen3), "--asr", str(whisper), "--llm-max-tokens", "400",
                       "--llm-temperature", "1.0", "--llm-seed", "1")
    chat_port = free_port()
    # Paced at 50 tokens/s, a real LLM's rate: unpaced, the tiny model can finish a 60-token reply before its first
    # clause is spoken (CI saw the first audio delta one event after the last transcript delta), and the tests
    # check that speech starts while the thinker is still generating.
    chat_server = ROOT / "tests" / "helpers" / "tiny_chat_server.py"
    chat = subprocess.Popen([python, str(chat_server), str(qwen3), str(chat_port), "--token-delay-s", "0.02"], cwd=ROOT)
    chat_url = f"http://127.0.0.1:{chat_port}"
    url_agent = spawn(sys.executable, "--llm-url", f"{chat_url}/v1", "--llm-model", "tiny-qwen3",
                      "--llm-max-tokens", "400", "--llm-context-tokens", "300", "--llm-temperature", "1.0",
                      "--llm-seed", "1")
    try:
        yield Launched(chat_url, chat, url_agent, vllm_agent, t0)
    finally:
        for server in (url_agent, vllm_agent):
            server.stop()
            stop_group(server.process)
        chat.terminate()
        chat.wait(10)


def _remaining(t0: float) -> float:
    return max(1.0, START_TIMEOUT_S - (time.monotonic() - t0))


@pytest.fixture(scope="module")
def chat_endpoint(launched) -> str:
    while True:
        assert launched.chat.poll() is None, "the tiny chat server exited"
        try:
            if httpx.get(f"{launched.chat_url}/v1/models", timeout=2).status_code == 200:
                return launched.chat_url
        except httpx.HTTPError:
            pass
        assert time.monotonic() - launched.t0 < START_TIMEOUT_S, "the tiny chat server did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def url_agent(launched, chat_endpoint) -> Server:
    launched.url_agent.wait_healthy(_remaining(launched.t0))
    return launched.url_agent


@pytest.fixture(scope="module")
def vllm_agent(launched) -> Server:
    launched.vllm_agent.wait_healthy(_remaining(launched.t0))
    print(f"vLLM server (thinker + ASR) ready {time.monotonic() - launched.t0:.1f} s after launch")
    return launched.vllm_agent


def chat_stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=5).json()


@run_async
async def test_llm_url_streams_thinker_into_talker(url_agent, chat_endpoint):
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        created = await events_until(conn, "session.created")
        assert created[-1]["session"]["streamvox"]["responder"] == "thinker"
        await conn.session.update(session={"type": "realtime", "instructions": "You are terse.",
                                           "max_output_tokens": 60})
        await events_until(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello, who are you?"}]})
        await conn.response.create()
        events = await events_until(conn, "response.done")
        timings = check_response_flow(events)
        print("llm-url timings (ms):", timings)
        # The prompt in tokens as the URL thinker counts them (4 characters a token): "You are terse." (3) and
        # "Hello, who are you?" (4).
        assert events[-1]["response"]["usage"]["input_tokens"] == 7
        stats = chat_stats(chat_endpoint)
        assert stats["running"] == 0
        first = stats["last_messages"]
        assert first[0] == {"role": "system", "content": "You are terse."}
        assert first[-1]["content"] == "Hello, who are you?"

        # The next turn sees the history (the reply as spoken), cut to the context budget (300 tokens).
        reply = events[-1]["response"]["output"][0]["content"][0]["transcript"]
        for i in range(6):
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": f"Turn {i}: " + "tell me more about that, please. " * 6}]})
            await conn.response.create()
            await events_until(conn, "response.done")
            if i == 0:
                second = chat_stats(chat_endpoint)["last_messages"]
                assert second[1]["content"] == "Hello, who are you?"
                assert second[2] == {"role": "assistant", "content": reply}
        last = chat_stats(chat_endpoint)["last_messages"]
        assert last[0]["role"] == "system" and last[-1]["content"].startswith("Turn 5:")
        assert all(m["content"] != "Hello, who are you?" for m in last)  # the oldest turns were dropped
        assert sum(len(m["content"]) for m in last) < 4 * 300


@run_async
async def test_llm_url_cancel_stops_thinker_and_talker(url_agent, chat_endpoint):
    before = chat_stats(chat_endpoint)
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Talk for a while."}]})
        await conn.response.create()

        async def cancel_on_first_audio(event):
            if event["type"] in AUDIO_DELTAS and not cancel_on_first_audio.sent:
                cancel_on_first_audio.sent = True
                await conn.response.cancel()
        cancel_on_first_audio.sent = False
        events = await events_until(conn, "response.done", on_event=cancel_on_first_audio)
        done = events[-1]["response"]
        assert done["status"] == "cancelled", done["status_details"]
        assert done["streamvox"]["thinker"]["state"] == "aborted"
        assert done["streamvox"]["thinker"]["deltas"] < 400
        print("llm-url cancel: thinker", done["streamvox"]["thinker"], "timings (ms)", done["streamvox"]["timings_ms"])
    deadline = time.monotonic() + 10
    while True:
        stats = chat_stats(chat_endpoint)
        if stats["running"] == 0 and stats["aborted"] > before["aborted"]:
            break
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.1)
    assert url_agent.metric("streamvox_thinker_active_requests") == 0
    assert url_agent.metric("streamvox_active_requests") == 0


@run_async
async def test_llm_url_text_only_and_failure(url_agent):
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 20})
        await events_until(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hi."}]})
        await conn.response.create()
        events = await events_until(conn, "response.done")
        names = types(events)
        assert "response.output_text.delta" in names and not any(n in AUDIO_DELTAS for n in names)
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == "".join(deltas).strip()
        assert answered(events[-1]["response"])
        assert sent(events[-1]["response"]["usage"]) == expected_usage(1, len(deltas), 0)  # "Hi." in, the deltas out

        # The endpoint fails: the response fails with a clear error and the session goes on.
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        await events_until(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "__fail__"}]})
        await conn.response.create()
        done = (await events_until(conn, "response.done"))[-1]["response"]
        assert done["status"] == "failed"
        assert done["status_details"]["error"]["code"] == "thinker_failed"
        assert "500" in done["status_details"]["error"]["message"]
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Again."}]})
        await conn.response.create()
        assert answered((await events_until(conn, "response.done"))[-1]["response"])
    assert url_agent.metric("streamvox_active_requests") == 0


@run_async
async def test_llm_url_reply_cut_at_max_output_tokens_is_incomplete(url_agent, chat_endpoint):
    """The LLM stopped at the session's max_output_tokens (its finish_reason "length"): the response and its item are
    incomplete, reason max_output_tokens, with audio or text alone; a reply the LLM ends itself is completed."""
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        for modalities in (["audio"], ["text"]):
            await conn.session.update(session={"type": "realtime", "output_modalities": modalities,
                                               "max_output_tokens": 3})
            await events_until(conn, "session.updated")
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Tell me more."}]})
            await conn.response.create()
            done = (await events_until(conn, "response.done"))[-1]["response"]
            reason = chat_stats(chat_endpoint)["last_finish_reason"]
            assert reason == "length"  # 3 tokens of a random LLM: it did not end its turn by itself
            assert done["status"] == "incomplete" and answered(done)
            assert done["output"][0]["status"] == "incomplete"
    assert url_agent.metric("streamvox_active_requests") == 0


@run_async
async def test_llm_url_a_reference_to_a_missing_item_is_refused(url_agent, chat_endpoint):
    """response.input naming an item that does not exist gets an error event before any response starts (it was
    a response failed with a server error, leaving an empty assistant item in the conversation)."""
    started = chat_stats(chat_endpoint)["started"]
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        await conn.response.create(response={"input": [{"type": "item_reference", "id": "item_missing"}]})
        async for event in conn:
            data = event.model_dump()
            assert data["type"] != "response.created", data
            if data["type"] == "error":
                break
        assert (data["error"]["code"], data["error"]["param"]) == ("item_not_found", "response.input[0].id")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hi."}]})
        await conn.response.create()
        assert answered((await events_until(conn, "response.done"))[-1]["response"])
    assert chat_stats(chat_endpoint)["started"] == started + 1


@run_async
async def test_llm_url_nothing_to_answer(url_agent, chat_endpoint):
    """response.create with no instructions and no words in the conversation (an audio turn's transcript may be
    empty): the thinker is not asked (no chat template applies to no messages), the response fails as the client's
    request with a clear code, not as a thinker failure, and the session goes on."""
    started = chat_stats(chat_endpoint)["started"]
    async with sdk(url_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "  "}]})
        await conn.response.create()
        done = (await events_until(conn, "response.done"))[-1]["response"]
        assert done["status"] == "failed", done
        assert done["status_details"]["error"]["code"] == "no_input"
        assert done["status_details"]["error"]["type"] == "invalid_request_error"
        assert chat_stats(chat_endpoint)["started"] == started
        # instructions are something to answer
        await conn.session.update(session={"type": "realtime", "instructions": "Greet the user.",
                                           "max_output_tokens": 20})
        await events_until(conn, "session.updated")
        await conn.response.create()
        assert answered((await events_until(conn, "response.done"))[-1]["response"])
    assert url_agent.metric("streamvox_active_requests") == 0


# --llm and --asr: vLLM inside the server


@run_async
async def test_vllm_audio_turn(vllm_agent):
    pcm = speech_pcm(vllm_agent, "Hello there, what is the weather like today?")
    async with sdk(vllm_agent).realtime.connect(model="espeak") as conn:
        created = await events_until(conn, "session.created")
        info = created[-1]["session"]["streamvox"]
        assert info["thinker"]["kind"] == "vllm" and info["asr"]["kind"] == "vllm-whisper"
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 60})
        await events_until(conn, "session.updated")
        t0 = time.perf_counter()
        await append_audio(conn, pcm)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await events_until(conn, "response.done")
        names = types(events)
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        completed = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert completed["item_id"] == committed["item_id"] and completed["content_index"] == 0
        assert completed["usage"]["type"] == "duration"
        assert abs(completed["usage"]["seconds"] - len(pcm) / 48000) < 0.01
        deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert "".join(deltas).strip() == completed["transcript"]
        # the transcription finished before the thinker started, and the response came after it
        assert names.index("conversation.item.input_audio_transcription.completed") < names.index(
            "response.output_audio_transcript.delta")
        timings = check_response_flow(events)
        print(f"vLLM audio turn: {time.perf_counter() - t0:.2f} s to response.done; timings (ms): {timings}")
        item = await asyncio.wait_for(_retrieve(conn, committed["item_id"]), 10)
        assert item["content"][0]["transcript"] == completed["transcript"]


async def _retrieve(conn, item_id: str) -> dict:
    await conn.conversation.item.retrieve(item_id=item_id)
    async for event in conn:
        if event.type == "conversation.item.retrieved":
            return event.model_dump()["item"]


@run_async
async def test_vllm_server_vad_barge_in(vllm_agent):
    """The user talks over the reply (from its first audio delta): the barge-in is heard and interrupts the reply,
    both stages free its state, and the interruption becomes the next turn.

    The reply's audio is made far faster than real time (the random thinker's ~240 tokens, about a minute of
    speech, in about a second), and on a busy machine this client may read the first audio delta only after the
    thinker has finished: measured, it then waited on the CPU run queue most of that second, while the server
    answered the barge-in within a few ms of reading it. A user still hears that reply, so the server interrupts it
    either way: a reply still being generated is cancelled (its thinker aborted), and every reply not yet played to
    its end is cut at what can have been played (the item's transcript goes: no text the user has not heard)."""
    first = silence(0.3) + speech_pcm(vllm_agent, "Tell me a long story, please.") + silence(0.8)
    interruption = speech_pcm(vllm_agent, "Stop, stop.")
    async with sdk(vllm_agent).realtime.connect(model="espeak") as conn:
        await events_until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 400, "threshold": 0.5}}}})
        await events_until(conn, "session.updated")
        await append_audio(conn, first)

        async def barge_in_on_first_audio(event):
            if event["type"] in AUDIO_DELTAS and not barge_in_on_first_audio.sent:
                barge_in_on_first_audio.sent = True
                await append_audio(conn, interruption)  # the user talks over the reply
        barge_in_on_first_audio.sent = False
        events = await events_until(conn, "response.done", on_event=barge_in_on_first_audio)
        names = types(events)
        assert names.index("input_audio_buffer.speech_started") < names.index(
            "input_audio_buffer.speech_stopped") < names.index("input_audio_buffer.committed") < names.index(
            "response.created")
        assert "conversation.item.input_audio_transcription.completed" in names
        done = events[-1]["response"]
        reply_id = next(e for e in events if e["type"] == "response.output_item.added")["item"]["id"]
        reply_ms = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] in AUDIO_DELTAS) // 48
        thinker = done["streamvox"]["thinker"]
        if thinker["state"] == "aborted":  # heard while the thinker was still writing the reply
            assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected", done
            assert thinker["deltas"] < thinker["max_tokens"], thinker
        else:  # heard once the reply was written, while it still played
            assert thinker["state"] == "finished", thinker
        # the barge-in was heard, and the reply was cut at what can have been played
        after = await events_until(conn, "conversation.item.truncated")
        assert (names + types(after)).count("input_audio_buffer.speech_started") == 2, (names, types(after))
        truncated = after[-1]
        assert truncated["item_id"] == reply_id and 0 <= truncated["audio_end_ms"] <= reply_ms, (truncated, reply_ms)
        if thinker["state"] == "finished":
            assert truncated["audio_end_ms"] < reply_ms  # still playing
        print(f"barge-in: thinker {thinker['state']} after {thinker['deltas']} deltas, response {done['status']}, "
              f"reply cut at {truncated['audio_end_ms']} of {reply_ms} ms; timings (ms)",
              done["streamvox"]["timings_ms"])
        item = await asyncio.wait_for(_retrieve(conn, reply_id), 10)
        assert item["content"][0]["transcript"] == ""
        # both stages freed their state: no thinker request in vLLM, no talker request in the engine
        deadline = time.monotonic() + 10
        while vllm_agent.metric("streamvox_thinker_active_requests") or vllm_agent.metric(
                "streamvox_active_requests") or vllm_agent.metric("streamvox_asr_active_requests"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # the interruption becomes the next turn once the user stops talking
        await append_audio(conn, silence(0.8))
        events = await events_until(conn, "response.done")
        assert answered(events[-1]["response"])

"""`WS /v1/realtime` through the official `openai` SDK and a plain `websockets` client, on a real server."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import openai
import pytest
import websockets

from streamvox.audio.g711 import pcm16_to_alaw, pcm16_to_ulaw
from streamvox.server.realtime.responses import CANCEL_WAIT_S
from tests.helpers.audio import estimate_duration
from tests.helpers.realtime_clients import DELTA_TYPES, RealtimeClient, audio_of, reference_pcm
from tests.helpers.server import start_server

TEXT = "Good morning. The train to the coast leaves at nine, so pack light and bring a coat."
LONG_TEXT = " ".join(["This sentence keeps the response running for a good while, so that it can be cancelled."] * 40)

GA_ORDER = [
    "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_audio.done",
    "response.output_audio_transcript.done", "response.content_part.done", "response.output_item.done",
    "conversation.item.done", "response.done",
]
BETA_ORDER = [
    "response.created", "response.output_item.added", "conversation.item.created", "response.content_part.added",
    "response.audio.delta", "response.audio_transcript.delta", "response.audio.done",
    "response.audio_transcript.done", "response.content_part.done", "response.output_item.done", "response.done",
]


def _collapse(kinds: list[str]) -> list[str]:
    """Event types in order of first appearance, deltas collapsed (they interleave)."""
    seen: list[str] = []
    for kind in kinds:
        if kind not in seen:
            seen.append(kind)
    return seen


def sdk_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", websocket_base_url=f"{server.ws_url}/v1",
                              api_key=server.api_key or "x")


async def _sdk_say(connection, text: str) -> list:
    await connection.conversation.item.create(item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await connection.response.create()
    events = []
    async for event in connection:
        events.append(event)
        if event.type == "response.done":
            return events
    raise AssertionError("connection closed before response.done")


def _sdk_audio(events: list) -> bytes:
    return b"".join(base64.b64decode(e.delta) for e in events if e.type in DELTA_TYPES)


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_sdk_text_to_audio_response(espeak_server, beta):
    async def run():
        client = sdk_client(espeak_server)
        realtime = client.beta.realtime if beta else client.realtime
        async with realtime.connect(model="espeak") as connection:
            await connection.session.update(session={"voice": "echo"} if beta else {
                "type": "realtime", "audio": {"output": {"voice": "echo"}}})
            created = await connection.recv()
            assert created.type == "session.created"
            updated = await connection.recv()
            assert updated.type == "session.updated"
            voice = updated.session.voice if beta else updated.session.audio.output.voice
            assert voice == "echo"
            events = await _sdk_say(connection, TEXT)
        return events

    events = asyncio.run(run())
    kinds = [e.type for e in events]
    assert _collapse(kinds[kinds.index("response.created"):]) == (BETA_ORDER if beta else GA_ORDER)
    done = events[-1].response
    assert done.status == "completed"
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    transcript = [e for e in events if e.type.endswith("audio_transcript.done")][0].transcript
    assert transcript == TEXT
    pcm = _sdk_audio(events)
    samples = np.frombuffer(pcm, dtype="<i2")
    duration = len(samples) / 24000
    assert abs(duration - estimate_duration(TEXT)) < 0.3 * estimate_duration(TEXT), duration
    assert np.abs(samples).max() > 1000  # speech, not silence
    assert pcm == reference_pcm(espeak_server, TEXT, "echo")  # the same audio as the speech API gives


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_sdk_cancel_mid_response(espeak_server, beta):
    async def run():
        client = sdk_client(espeak_server)
        realtime = client.beta.realtime if beta else client.realtime
        async with realtime.connect(model="espeak") as connection:
            await connection.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_TEXT}]})
            await connection.response.create()
            events, cancelled_at = [], None
            async for event in connection:
                events.append(event)
                if event.type in DELTA_TYPES and cancelled_at is None:
                    cancelled_at = len(events)
                    await connection.response.cancel()
                if event.type == "response.done":
                    break
            # the session goes on: the next response completes, and nothing of the old one arrives after its done
            later = await _sdk_say(connection, "Still here.")
        return events, later

    events, later = asyncio.run(run())
    done = events[-1].response
    assert done.status == "cancelled"
    assert done.status_details.reason == "client_cancelled"
    assert done.output[0].status == "incomplete"
    old_id = done.id
    assert not [e for e in later if getattr(e, "response_id", None) == old_id]
    assert later[-1].response.status == "completed" and _sdk_audio(later)
    full_seconds = estimate_duration(LONG_TEXT)
    heard = len(_sdk_audio(events)) / 48000
    assert heard < full_seconds / 2, (heard, full_seconds)


def expected_usage(input_text: int = 0, output_text: int = 0, output_audio: int = 0) -> dict:
    return {"total_tokens": input_text + output_text + output_audio, "input_tokens": input_text,
            "output_tokens": output_text + output_audio,
            "input_token_details": {"text_tokens": input_text, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": output_text, "audio_tokens": output_audio}}


def test_usage_of_echo_responses(espeak_server):
    """`response.done` usage of the echo responder: audio counts the engine's tokens (espeak: the words in, its
    synthesis chunks out), text counts words in and out, a cancelled audio response the deltas it sent."""
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        audio = await client.say(TEXT)
        text = await client.say("Just text, please.", output_modalities=["text"])
        await client.send({"type": "response.create", "response": {"instructions": LONG_TEXT}})
        await client.until("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        cancelled = await client.until("response.done")
        await client.close()
        return audio, text, cancelled

    audio, text, cancelled = asyncio.run(run())
    assert audio[-1]["response"]["usage"] == expected_usage(input_text=17, output_audio=86)
    assert text[-1]["response"]["usage"] == expected_usage(input_text=3, output_text=3)
    assert cancelled[-1]["response"]["status"] == "cancelled"
    deltas = len([e for e in cancelled if e["type"] in DELTA_TYPES]) + 1  # the one `until` stopped at
    assert cancelled[-1]["response"]["usage"] == expected_usage(input_text=len(LONG_TEXT.split()),
                                                                 output_audio=deltas)


def test_engine_request_is_freed_after_cancel(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_TEXT}]}})
        await client.send({"type": "response.create"})
        await client.until("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        for _ in range(50):
            if espeak_server.metric("streamvox_active_requests") == 0:
                break
            await asyncio.sleep(0.05)
        assert espeak_server.metric("streamvox_active_requests") == 0
        await client.close()

    asyncio.run(run())


def test_barge_in_new_response_cancels_running_one(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_TEXT}]}})
        await client.send({"type": "response.create"})
        first = await client.until("response.output_audio.delta")
        old_id = first[-1]["response_id"]
        await client.send({"type": "response.create", "response": {"instructions": "Sorry, go ahead."}})
        events = await client.until("response.done")
        assert events[-1]["response"]["id"] == old_id and events[-1]["response"]["status"] == "cancelled"
        events = await client.until("response.done")
        assert events[0]["type"] == "response.created"
        assert all(e.get("response_id", events[0]["response"]["id"]) != old_id for e in events)
        assert events[-1]["response"]["status"] == "completed"
        transcript = [e for e in events if e["type"] == "response.output_audio_transcript.done"][0]["transcript"]
        assert transcript == "Sorry, go ahead."
        await client.close()

    asyncio.run(run())


def test_response_created_comes_before_the_next_events_answer(espeak_server):
    """The server answers client events in the order they came: a response.create's response.created before the
    error for the event sent right after it (a client waiting on that error then knows a response is running)."""
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        for _ in range(5):
            await client.send({"type": "response.create", "response": {"instructions": "Hello."}})
            await client.send({"type": "bogus.event", "event_id": "next"})
            events = await client.until("error")
            assert events[-1]["error"]["event_id"] == "next"
            assert "response.created" in [e["type"] for e in events[:-1]], [e["type"] for e in events]
            await client.until("response.done")
        await client.close()

    asyncio.run(run())


def test_session_created_shapes_and_responder(espeak_server):
    async def run():
        ga = await RealtimeClient.connect(espeak_server)
        beta = await RealtimeClient.connect(espeak_server, beta=True)
        assert ga.session["type"] == "realtime" and ga.session["output_modalities"] == ["audio"]
        assert ga.session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert beta.session["output_audio_format"] == "pcm16" and "audio" in beta.session["modalities"]
        for session in (ga.session, beta.session):
            assert session["streamvox"]["responder"] == "echo" and session["streamvox"]["asr"] is None
        # each dialect accepts the other's session shape, and answers in its own
        await ga.send({"type": "session.update", "session": {"voice": "nova", "output_audio_format": "g711_ulaw"}})
        updated = (await ga.expect("session.updated"))["session"]
        assert updated["audio"]["output"]["voice"] == "nova"
        assert updated["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        await beta.send({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": "nova", "format": {"type": "audio/pcma"}}}}})
        updated = (await beta.expect("session.updated"))["session"]
        assert updated["voice"] == "nova" and updated["output_audio_format"] == "g711_alaw"
        # a bad field keeps its value; the update's other fields apply
        await ga.send({"type": "session.update", "event_id": "evt_bad",
                       "session": {"voice": "alloy", "audio": {"output": {"speed": 9}}}})
        error = await ga.expect("error")
        assert error["error"]["param"] == "session.audio.output.speed" and error["error"]["event_id"] == "evt_bad"
        updated = (await ga.expect("session.updated"))["session"]
        assert updated["audio"]["output"]["voice"] == "alloy" and updated["audio"]["output"]["speed"] == 1.0
        await ga.close()
        await beta.close()

    asyncio.run(run())


def test_session_update_applies_its_valid_fields_and_names_each_invalid_one(espeak_server):
    """A voice the model lacks (or any other bad field) gets an error naming that field and keeps its value;
    the update's valid fields still apply, then session.updated follows."""
    async def run():
        for beta in (False, True):
            client = await RealtimeClient.connect(espeak_server, beta=beta)
            await client.send({"type": "session.update", "event_id": "evt_mixed", "session": {
                "voice": "nobody", "speed": 1.5, "instructions": "Be brief.", "output_modalities": ["text"],
                "temperature": "hot",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                    "turn_detection": {"type": "server_vad", "threshold": 2}},
                          "output": {"voice": {"id": "voice_missing"}, "format": {"type": "audio/pcmu"}}}}})
            errors = [await client.expect("error") for _ in range(4)]
            assert sorted(e["error"]["param"] for e in errors) == [
                "session.audio.input.turn_detection.threshold", "session.audio.output.voice", "session.temperature",
                "session.voice"]
            assert all(e["error"]["event_id"] == "evt_mixed" and e["error"]["type"] == "invalid_request_error"
                       for e in errors)
            assert any("nobody" in e["error"]["message"] for e in errors)
            session = (await client.expect("session.updated"))["session"]
            if beta:
                assert session["voice"] == "alloy" and session["speed"] == 1.5 and session["modalities"] == ["text"]
                assert session["input_audio_format"] == "pcm16" and session["output_audio_format"] == "g711_ulaw"
                assert session["turn_detection"] is None and session["temperature"] == 0.8
            else:
                output = session["audio"]["output"]
                assert output["voice"] == "alloy" and output["speed"] == 1.5
                assert output["format"] == {"type": "audio/pcmu"}
                assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
                assert session["audio"]["input"]["turn_detection"] is None
                assert session["output_modalities"] == ["text"]
            assert session["instructions"] == "Be brief."
            # a session that is not a realtime session object is refused whole
            await client.send({"type": "session.update", "session": {"type": "transcription", "voice": "nova"}})
            assert (await client.expect("error"))["error"]["param"] == "session.type"
            await client.send({"type": "session.update", "session": {"voice": "nova"}})
            session = (await client.expect("session.updated"))["session"]
            assert (session["voice"] if beta else session["audio"]["output"]["voice"]) == "nova"
            await client.close()

    asyncio.run(run())


@pytest.mark.parametrize("fmt,encoding,rate", [
    ({"type": "audio/pcm", "rate": 16000}, None, 16000),
    ({"type": "audio/pcmu"}, pcm16_to_ulaw, 8000),
    ({"type": "audio/pcma"}, pcm16_to_alaw, 8000),
])
def test_output_formats_match_reference(espeak_server, fmt, encoding, rate):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "session.update", "session": {"audio": {"output": {"format": fmt}}}})
        await client.expect("session.updated")
        events = await client.say(TEXT)
        await client.close()
        return audio_of(events)

    audio = asyncio.run(run())
    reference = reference_pcm(espeak_server, TEXT, "alloy", rate)
    if encoding is not None:
        reference = encoding(np.frombuffer(reference, dtype="<i2"))
    assert audio == reference


def test_text_only_response_and_response_overrides(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        events = await client.say("Just text, please.", output_modalities=["text"])
        kinds = [e["type"] for e in events]
        assert "response.output_text.delta" in kinds and not audio_of(events)
        assert [e for e in events if e["type"] == "response.output_text.done"][0]["text"] == "Just text, please."
        # out-of-band response: conversation "none", input given inline, a voice for this response only
        await client.send({"type": "response.create", "response": {
            "conversation": "none", "audio": {"output": {"voice": "onyx"}},
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Inline."}]}]}})
        events = await client.until("response.done")
        assert "conversation.item.added" not in [e["type"] for e in events]
        assert events[-1]["response"]["conversation_id"] is None
        assert audio_of(events) == reference_pcm(espeak_server, "Inline.", "onyx")
        # nothing to say: the response fails with a reason, the session goes on
        await client.send({"type": "conversation.item.delete", "item_id": "missing"})
        assert (await client.expect("error"))["error"]["code"] == "item_not_found"
        await client.close()
        fresh = await RealtimeClient.connect(espeak_server)
        await fresh.send({"type": "response.create"})
        events = await fresh.until("response.done")
        assert events[-1]["response"]["status"] == "failed"
        assert events[-1]["response"]["status_details"]["error"]["code"] == "no_input_text"
        await fresh.close()

    asyncio.run(run())


def test_conversation_items_retrieve_truncate_delete(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "conversation.item.create", "item": {
            "id": "item_first", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "First."}]}})
        added = await client.expect("conversation.item.added")
        assert added["item"]["id"] == "item_first" and added["previous_item_id"] is None
        await client.expect("conversation.item.done")
        await client.send({"type": "conversation.item.create", "item": {
            "id": "item_first", "type": "message", "role": "user", "content": []}})
        assert (await client.expect("error"))["error"]["code"] == "duplicate_item_id"
        await client.send({"type": "conversation.item.create", "previous_item_id": "root", "item": {
            "id": "item_zero", "type": "message", "role": "system", "content": [{"type": "input_text", "text": "S"}]}})
        assert (await client.expect("conversation.item.added"))["previous_item_id"] is None
        await client.expect("conversation.item.done")
        await client.send({"type": "conversation.item.retrieve", "item_id": "item_first"})
        retrieved = await client.expect("conversation.item.retrieved")
        assert retrieved["item"]["content"][0]["text"] == "First."
        events = await client.say("Truncate me later.")
        item = events[-1]["response"]["output"][0]
        audio_ms = len(audio_of(events)) * 1000 // 48000
        await client.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0,
                           "audio_end_ms": audio_ms + 5000})
        assert (await client.expect("error"))["error"]["param"] == "audio_end_ms"
        await client.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0,
                           "audio_end_ms": 300})
        truncated = await client.expect("conversation.item.truncated")
        assert truncated["audio_end_ms"] == 300
        await client.send({"type": "conversation.item.delete", "item_id": "item_first"})
        assert (await client.expect("conversation.item.deleted"))["item_id"] == "item_first"
        await client.send({"type": "conversation.item.retrieve", "item_id": "item_first"})
        assert (await client.expect("error"))["error"]["code"] == "item_not_found"
        await client.close()

    asyncio.run(run())


def test_input_audio_buffer_without_asr(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
        error = (await client.expect("error"))["error"]
        assert error["code"] == "input_audio_buffer_commit_empty" and error["event_id"] == "c1"
        second = base64.b64encode(np.zeros(24000, "<i2").tobytes()).decode()
        await client.send({"type": "input_audio_buffer.append", "audio": second})  # no acknowledgement
        await client.send({"type": "input_audio_buffer.commit"})
        error = (await client.expect("error"))["error"]
        assert error["code"] == "input_audio_not_supported" and "conversation.item.create" in error["message"]
        await client.send({"type": "input_audio_buffer.append", "audio": "not base64!"})
        assert (await client.expect("error"))["error"]["param"] == "audio"
        await client.send({"type": "input_audio_buffer.clear"})
        await client.expect("input_audio_buffer.cleared")
        # the per-turn cap: 15 minutes of 8 kHz G.711 is 7.2 MB
        await client.send({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}})
        await client.expect("session.updated")
        big = base64.b64encode(bytes(7_300_000)).decode()
        await client.send({"type": "input_audio_buffer.append", "audio": big})
        assert (await client.expect("error"))["error"]["code"] == "input_audio_buffer_full"
        events = await client.say("Still fine.")
        assert events[-1]["response"]["status"] == "completed"
        await client.close()

    asyncio.run(run())


def test_bad_input_gets_error_events_and_spares_other_sessions(espeak_server):
    async def run():
        bystander = await RealtimeClient.connect(espeak_server)
        bystander_events = asyncio.create_task(bystander.say(TEXT))
        client = await RealtimeClient.connect(espeak_server)

        async def error_for(frame) -> dict:
            await client.ws.send(frame)
            return (await client.expect("error"))["error"]

        assert (await error_for("{not json"))["code"] == "invalid_json"
        assert (await error_for("[1, 2]"))["code"] == "invalid_event"
        assert (await error_for('{"no_type": 1}'))["code"] == "invalid_event"
        assert (await error_for(json.dumps({"type": "made.up", "event_id": "e9"})))["event_id"] == "e9"
        assert (await error_for(b'{"type": "response.create"}'))["code"] == "invalid_frame"
        oversized = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 * 1024 * 1024 + 4)})
        assert (await error_for(oversized))["code"] == "event_too_large"
        assert (await error_for(json.dumps({"type": "response.cancel"})))["code"] == "response_cancel_not_active"
        assert (await error_for(json.dumps({"type": "conversation.item.truncate", "item_id": "nope",
                                            "content_index": 0, "audio_end_ms": 1})))["code"] == "item_not_found"
        assert (await error_for(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "robot", "content": []}})))["param"] == "item.role"
        assert (await error_for(json.dumps({"type": "session.update", "session": {"voice": "nobody"}})))[
            "param"] == "session.voice"
        await client.expect("session.updated")  # the update's other (no) fields applied
        assert (await error_for(json.dumps({"type": "response.create", "response": {"voice": "nobody"}})))[
            "param"] == "response.voice"
        events = await client.say(TEXT)  # the session survived all of it
        assert events[-1]["response"]["status"] == "completed"
        assert audio_of(events) == reference_pcm(espeak_server, TEXT, "alloy")
        assert audio_of(await bystander_events) == audio_of(events)
        await client.close()
        await bystander.close()

    asyncio.run(run())


def test_lists_and_objects_where_a_string_belongs_get_field_errors(espeak_server):
    """Values that cannot be looked up in a set or dict (lists, objects) are refused like any other bad value,
    naming their field, and the rest of a session.update still applies."""
    user = {"type": "message", "role": "user"}
    cases = [
        ({"type": "session.update", "session": {"instructions": "One.", "output_modalities": [{"a": 1}]}},
         "session.output_modalities"),
        ({"type": "session.update", "session": {"instructions": "Two.", "audio": {
            "output": {"format": {"type": ["audio/pcm"]}}}}}, "session.audio.output.format.type"),
        ({"type": "response.create", "response": {"output_modalities": [["audio"]]}}, "response.output_modalities"),
        ({"type": "conversation.item.create", "item": {**user, "content": [{"type": ["input_text"], "text": "x"}]}},
         "item.content[0].type"),
        ({"type": "response.create", "response": {"conversation": "none", "input": [
            {**user, "content": [{"type": {"x": 1}, "text": "x"}]}]}}, "response.input[0].content[0].type"),
    ]

    async def run():
        client = await RealtimeClient.connect(espeak_server)
        for event, param in cases:
            await client.send(event)
            error = (await client.expect("error"))["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param), error
            if event["type"] == "session.update":
                session = (await client.expect("session.updated"))["session"]
                assert session["instructions"] == event["session"]["instructions"]
        events = await client.say(TEXT)
        assert events[-1]["response"]["status"] == "completed" and audio_of(events)
        await client.close()

    asyncio.run(run())


async def speaking(client: RealtimeClient, text: str) -> list[dict]:
    """Start a response that says `text`; its events up to its first audio delta."""
    await client.send({"type": "response.create", "response": {"instructions": text}})
    events = []
    while not events or events[-1]["type"] not in DELTA_TYPES:
        events.append(await client.recv())
    return events


def test_truncating_the_item_being_spoken_stops_its_response(espeak_server):
    """A barge-in that truncates the running response's item (without cancelling it first) stops the response,
    then truncates what it sent."""
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        events = await speaking(client, LONG_TEXT)
        item_id = events[-1]["item_id"]
        await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                           "audio_end_ms": 10})
        events += await client.until("response.done")
        truncated = await client.expect("conversation.item.truncated")
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.expect("conversation.item.retrieved"))["item"]
        await client.close()
        return events, truncated, item

    events, truncated, item = asyncio.run(run())
    done = events[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")
    assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == (item["id"], 0, 10)
    assert item["status"] == "incomplete" and item["content"][0]["transcript"] == ""
    assert len(audio_of(events)) / 48000 < estimate_duration(LONG_TEXT) / 2


@pytest.mark.parametrize("audio_end_ms", [-1, 3_600_000])
def test_a_refused_truncate_of_the_item_being_spoken_leaves_its_response_running(espeak_server, audio_end_ms):
    """A truncate that is refused (a negative length, or more audio than has been sent) changes nothing: the
    response runs on to its end."""
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        events = await speaking(client, TEXT)
        await client.send({"type": "conversation.item.truncate", "item_id": events[-1]["item_id"],
                           "content_index": 0, "audio_end_ms": audio_end_ms})
        events += await client.until("response.done")
        await client.close()
        return events

    events = asyncio.run(run())
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e["param"] for e in errors] == ["audio_end_ms"], errors
    assert events[-1]["response"]["status"] == "completed"
    assert "conversation.item.truncated" not in [e["type"] for e in events]


def test_deleting_the_item_being_spoken_leaves_it_deleted(espeak_server):
    """The running reply's item deleted: the reply may run on, but the item stays out of the conversation and
    gets no conversation.item.done after its conversation.item.deleted."""
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        events = await speaking(client, TEXT)
        item_id = events[-1]["item_id"]
        await client.send({"type": "conversation.item.delete", "item_id": item_id})
        events += await client.until("response.done")
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        events += await client.until("error")  # (and whatever came before it)
        await client.close()
        return item_id, events

    item_id, events = asyncio.run(run())
    names = [e["type"] for e in events if e.get("item_id") == item_id or e.get("item", {}).get("id") == item_id]
    assert "conversation.item.deleted" in names
    assert "conversation.item.done" not in names[names.index("conversation.item.deleted"):]
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "item_not_found"


def test_32_concurrent_sessions_are_isolated(espeak_server):
    voices = ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
              "en-gb-x-rp"]
    words = ["apple", "river", "mountain", "violet", "engine", "harbor", "lantern", "meadow"]
    cases = [(voices[i % len(voices)], f"Session {i} reports: {words[i % 8]} and {words[(3 * i + 1) % 8]}, "
                                       f"then {i * 7} more.") for i in range(32)]
    references = [reference_pcm(espeak_server, text, voice) for voice, text in cases]

    async def one(voice: str, text: str) -> tuple[dict, list[dict]]:
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "session.update", "session": {"audio": {"output": {"voice": voice}}}})
        await client.expect("session.updated")
        events = await client.say(text)
        await client.close()
        return client.session, events

    async def run():
        return await asyncio.gather(*(one(voice, text) for voice, text in cases))

    results = asyncio.run(run())
    session_ids = {session["id"] for session, _ in results}
    assert len(session_ids) == 32
    for (voice, text), reference, (_, events) in zip(cases, references, results, strict=True):
        response_id = events[-1]["response"]["id"]
        assert events[-1]["response"]["status"] == "completed"
        assert all(e.get("response_id", response_id) == response_id for e in events)
        transcript = [e for e in events if e["type"] == "response.output_audio_transcript.done"][0]["transcript"]
        assert transcript == text
        assert audio_of(events) == reference, (voice, text)


def test_api_key_bearer_and_browser_subprotocol():
    server = start_server(api_key="sekret-key")
    try:
        async def run():
            client = sdk_client(server)
            async with client.realtime.connect(model="espeak") as connection:  # Authorization: Bearer
                events = await _sdk_say(connection, "Authorized.")
                assert events[-1].response.status == "completed"
            async with websockets.connect(f"{server.ws_url}/v1/realtime?model=espeak",
                                          subprotocols=["realtime", "openai-insecure-api-key.sekret-key"]) as ws:
                assert ws.subprotocol == "realtime"
                assert json.loads(await asyncio.wait_for(ws.recv(), 20))["type"] == "session.created"
            async with websockets.connect(f"{server.ws_url}/v1/audio/speech/stream",
                                          additional_headers={"Authorization": "Bearer sekret-key"}) as ws:
                await ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
                assert json.loads(await asyncio.wait_for(ws.recv(), 20))["type"] == "audio.start"
            for path in ("/v1/realtime", "/v1/audio/speech/stream"):
                for kwargs in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}},
                               {"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]}):
                    with pytest.raises(websockets.InvalidStatus) as refused:
                        async with websockets.connect(f"{server.ws_url}{path}", **kwargs):
                            pass
                    assert refused.value.response.status_code == 403

        asyncio.run(run())
    finally:
        server.stop()


def test_idle_sessions_are_closed():
    server = start_server(env={"STREAMVOX_REALTIME_IDLE_TIMEOUT_S": "1", "STREAMVOX_SPEECH_STREAM_IDLE_TIMEOUT_S": "1"})
    try:
        async def run():
            client = await RealtimeClient.connect(server)
            error = await client.expect("error", timeout=5)
            assert error["error"]["code"] == "idle_timeout"
            with pytest.raises(websockets.ConnectionClosedOK):
                await client.recv(timeout=5)
            async with websockets.connect(f"{server.ws_url}/v1/audio/speech/stream") as ws:
                assert json.loads(await asyncio.wait_for(ws.recv(), 5))["code"] == "idle_timeout"
                with pytest.raises(websockets.ConnectionClosedOK):
                    await asyncio.wait_for(ws.recv(), 5)
            async with websockets.connect(f"{server.ws_url}/v1/audio/speech/stream") as ws:
                await ws.send(json.dumps({"type": "input.text", "text": "Hello, and then"}))  # never ended
                events = []
                with pytest.raises(websockets.ConnectionClosedOK):
                    while True:
                        message = await asyncio.wait_for(ws.recv(), 5)
                        if isinstance(message, str):
                            events.append(json.loads(message))
            # the open utterance still gets its done (every audio.start has one), cancelled, before the close
            assert [e["type"] for e in events] == ["audio.start", "error", "audio.done"], events
            assert events[1]["code"] == "idle_timeout" and events[2]["reason"] == "cancelled"

        asyncio.run(run())
    finally:
        server.stop()


def test_abrupt_disconnects_free_engine_requests_and_sessions(espeak_server):
    async def run():
        realtime = await RealtimeClient.connect(espeak_server)
        await realtime.send({"type": "response.create", "response": {"instructions": LONG_TEXT}})
        await realtime.until("response.output_audio.delta")
        stream = await websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream")
        await stream.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))  # input left open
        assert json.loads(await asyncio.wait_for(stream.recv(), 20))["type"] == "audio.start"
        assert espeak_server.metric("streamvox_websocket_sessions") == 2
        realtime.ws.transport.abort()  # no close handshake
        stream.transport.abort()
        for _ in range(100):
            if espeak_server.metric("streamvox_active_requests") == 0 \
                    and espeak_server.metric("streamvox_websocket_sessions") == 0:
                break
            await asyncio.sleep(0.05)
        assert espeak_server.metric("streamvox_active_requests") == 0
        assert espeak_server.metric("streamvox_websocket_sessions") == 0

    asyncio.run(run())


def test_a_split_utterance_whose_client_leaves_counts_as_cancelled(espeak_server):
    """With text_split, an utterance ended by the client's disconnect is a cancelled request in the metrics,
    not an ok one, as without it."""
    name = 'streamvox_requests_total{route="speech_stream",status="%s"}'

    def count(status: str) -> float:
        try:
            return espeak_server.metric(name % status)
        except KeyError:
            return 0.0

    async def run():
        before = count("cancelled"), count("ok")
        stream = await websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream")
        await stream.send(json.dumps({"type": "session.config", "text_split": "sentence"}))
        await stream.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))  # input left open
        assert json.loads(await asyncio.wait_for(stream.recv(), 20))["type"] == "audio.start"
        await stream.recv()  # its first audio
        stream.transport.abort()
        for _ in range(200):  # the utterance is counted as its task ends, after the session's teardown
            if count("cancelled") > before[0] or count("ok") > before[1]:
                break
            await asyncio.sleep(0.05)
        assert (count("cancelled"), count("ok")) == (before[0] + 1, before[1])

    asyncio.run(run())


def test_output_audio_buffer_clear_and_cancel_by_id(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server)
        await client.send({"type": "response.create", "response": {"instructions": LONG_TEXT}})
        first = await client.until("response.output_audio.delta")
        response_id = first[-1]["response_id"]
        await client.send({"type": "response.cancel", "response_id": "resp_other"})
        await client.send({"type": "output_audio_buffer.clear"})
        events = await client.until("output_audio_buffer.cleared")
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["response_cancel_not_active"]
        done = [e for e in events if e["type"] == "response.done"]
        assert done and done[0]["response"]["status"] == "cancelled"
        assert events[-1]["response_id"] == response_id
        assert not [e for e in events[events.index(done[0]):] if e["type"] in DELTA_TYPES]
        await client.close()

    asyncio.run(run())


def test_beta_text_only_event_names(espeak_server):
    async def run():
        client = await RealtimeClient.connect(espeak_server, beta=True)
        await client.send({"type": "session.update", "session": {"modalities": ["text"]}})
        assert (await client.expect("session.updated"))["session"]["modalities"] == ["text"]
        events = await client.say("Text in the beta dialect.")
        kinds = [e["type"] for e in events]
        assert "response.text.delta" in kinds and "response.text.done" in kinds
        assert not [k for k in kinds if "audio" in k]
        item = events[-1]["response"]["output"][0]
        assert item["content"] == [{"type": "text", "text": "Text in the beta dialect."}]
        await client.close()

    asyncio.run(run())


def test_barge_in_on_a_client_that_stopped_reading(espeak_server):
    """The old response is stuck on backpressure: it still ends with a cancelled response.done, in order."""
    async def run():
        client = await RealtimeClient.connect(espeak_server, max_queue=1)
        await client.send({"type": "response.create", "response": {"instructions": LONG_TEXT}})
        await asyncio.sleep(2.0)  # not reading: socket buffers fill up, the server's sends block
        await client.send({"type": "response.create", "response": {"instructions": "Next."}})
        await asyncio.sleep(CANCEL_WAIT_S + 1.0)  # still not reading: the server gives up waiting for the old task
        events = await client.until("response.done", timeout=30)
        old = events[0]["response"]["id"]
        assert events[-1]["response"]["id"] == old and events[-1]["response"]["status"] == "cancelled"
        events = await client.until("response.done", timeout=30)
        assert events[0]["type"] == "response.created" and events[0]["response"]["id"] != old
        assert events[-1]["response"]["status"] == "completed"
        assert not [e for e in events if e.get("response_id") == old]
        await client.close()

    asyncio.run(run())


def test_engine_crash_fails_requests_and_the_sessions_recover():
    import os
    import signal

    import httpx

    server = start_server()
    try:
        async def run():
            client = await RealtimeClient.connect(server)
            stream = await websockets.connect(f"{server.ws_url}/v1/audio/speech/stream", max_size=None)
            await stream.send(json.dumps({"type": "input.text", "text": "Waiting for the rest, "}))  # input open
            assert json.loads(await asyncio.wait_for(stream.recv(), 20))["type"] == "audio.start"
            os.kill(httpx.get(f"{server.url}/health").json()["engine_pid"], signal.SIGKILL)
            stream_events = []  # the open utterance was in the engine: it ends with an error
            while not stream_events or stream_events[-1].get("type") != "audio.done":
                message = await asyncio.wait_for(stream.recv(), 20)
                if isinstance(message, str):
                    stream_events.append(json.loads(message))
            assert stream_events[-2]["type"] == "error" and stream_events[-2]["code"] == "engine_unavailable"
            assert stream_events[-1]["reason"] == "error"
            while httpx.get(f"{server.url}/health").status_code == 200:
                await asyncio.sleep(0.02)
            events = await client.say("Anyone there?")  # while the engine is down
            done = events[-1]["response"]
            assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "engine_unavailable"
            await asyncio.to_thread(server.wait_healthy)  # the engine restarts; both sessions go on
            events = await client.say("Back again.")
            assert events[-1]["response"]["status"] == "completed" and audio_of(events)
            await stream.send(json.dumps({"type": "input.text", "text": "dropped: its utterance failed."}))
            await stream.send(json.dumps({"type": "input.done"}))  # closes the failed utterance
            await stream.send(json.dumps({"type": "input.text", "text": "Back again."}))
            await stream.send(json.dumps({"type": "input.done"}))
            start = json.loads(await asyncio.wait_for(stream.recv(), 20))
            assert start["type"] == "audio.start" and start["utterance_index"] == 1
            pcm = b""
            while isinstance(message := await asyncio.wait_for(stream.recv(), 20), bytes):
                pcm += message
            assert json.loads(message)["reason"] == "stop"
            assert pcm == reference_pcm(server, "Back again.", "alloy")  # nothing of the dropped text
            await client.close()
            await stream.close()

        asyncio.run(run())
    finally:
        server.stop()

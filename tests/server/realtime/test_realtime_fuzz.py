"""Random client events on a live `/v1/realtime` session: always an orderly answer, never a server error."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.realtime_clients import RealtimeClient

EVENT_TYPES = [
    "session.update", "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
    "conversation.item.create", "conversation.item.retrieve", "conversation.item.truncate",
    "conversation.item.delete", "response.create", "response.cancel", "output_audio_buffer.clear", "bogus.event",
]
KEYS = ["session", "item", "response", "audio", "item_id", "content_index", "audio_end_ms", "previous_item_id",
        "response_id", "event_id", "voice", "type", "role", "content", "text", "format", "rate", "output",
        "input", "instructions", "modalities", "output_modalities", "conversation", "speed"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 100000), st.floats(allow_nan=False, width=32),
                    st.sampled_from(["", "alloy", "nova", "root", "user", "assistant", "message", "input_text",
                                     "audio/pcm", "audio/pcmu", "pcm16", "g711_alaw", "text", "audio", "none",
                                     "auto", "AAAA", "item_x", "Hello there."]),
                    st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=12)
events = st.builds(lambda kind, fields: {**fields, "type": kind}, st.sampled_from(EVENT_TYPES),
                   st.dictionaries(st.sampled_from(KEYS), values, max_size=5))


def test_random_events_never_break_the_session(espeak_server):
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(RealtimeClient.connect(espeak_server))
    server_errors: list[dict] = []

    async def exchange(event: dict) -> None:
        await client.send(event)
        # a probe behind the event: once its error arrives, the event was handled
        await client.send({"type": "conversation.item.retrieve", "item_id": "probe_missing", "event_id": "probe"})
        while True:
            answer = await client.recv(timeout=30)
            if answer["type"] == "response.done" and answer["response"]["status"] == "failed" \
                    and answer["response"]["status_details"]["error"]["type"] == "server_error":
                server_errors.append({"event": event, "answer": answer})
            if answer["type"] == "error":
                if answer["error"]["type"] == "server_error":
                    server_errors.append({"event": event, "answer": answer})
                if answer["error"]["event_id"] == "probe":
                    return

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(events)
    def check(event: dict) -> None:
        loop.run_until_complete(exchange(event))
        assert not server_errors, json.dumps(server_errors[0])[:2000]

    try:
        check()
        loop.run_until_complete(client.send({"type": "response.cancel"}))
        loop.run_until_complete(client.close())
        fresh = loop.run_until_complete(RealtimeClient.connect(espeak_server))
        events_ = loop.run_until_complete(fresh.say("Still standing."))
        assert events_[-1]["response"]["status"] == "completed"
        loop.run_until_complete(fresh.close())
    finally:
        loop.close()


STREAM_TYPES = ["session.config", "input.text", "input.done", "input.cancel", "bogus"]
STREAM_KEYS = ["text", "voice", "sample_rate", "speed", "response_format", "text_split", "language", "seed",
               "instructions", "model"]
stream_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 100000), st.floats(allow_nan=False, width=32),
                           st.sampled_from(["pcm", "wav", "alloy", "en-us", "auto", "none", "sentence", "clause",
                                            "Hi there. ", "and more, ", "espeak"]),
                           st.text(max_size=20))
stream_events = st.builds(lambda kind, fields: {**fields, "type": kind}, st.sampled_from(STREAM_TYPES),
                          st.dictionaries(st.sampled_from(STREAM_KEYS), stream_scalars, max_size=4))


def test_random_stream_messages_never_break_the_session(espeak_server):
    import websockets

    loop = asyncio.new_event_loop()
    ws = loop.run_until_complete(websockets.connect(f"{espeak_server.ws_url}/v1/audio/speech/stream"))
    problems: list[dict] = []
    counter = iter(range(10**9))

    async def exchange(event: dict) -> None:
        probe = f"probe.{next(counter)}"
        await ws.send(json.dumps(event))
        await ws.send(json.dumps({"type": probe}))
        while True:
            message = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(message, bytes):
                continue
            answer = json.loads(message)
            if answer["type"] == "error" and answer["code"] == "server_error" or answer.get("reason") == "error":
                problems.append({"event": event, "answer": answer})
            if answer["type"] == "error" and probe in answer["message"]:
                return

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(stream_events)
    def check(event: dict) -> None:
        loop.run_until_complete(exchange(event))
        assert not problems, json.dumps(problems[0])[:2000]

    try:
        check()
        loop.run_until_complete(ws.send(json.dumps({"type": "input.cancel"})))
        loop.run_until_complete(ws.close())
    finally:
        loop.close()

"""Property-based fuzzing of the WebSocket protocols against a real server, with a good stream alongside.

`/v1/realtime` and `/v1/audio/speech/stream` get random sequences of events
(known types with random or plausible fields, unknown types, non-JSON and
binary frames). Properties: the session stays open and answers a sentinel
event after the sequence; every `error` is in the protocol's shape and never
the catch-all `server_error` (a bug); text-stream utterances each get exactly one
`audio.start` and one `audio.done`, in order, and `session.close` closes with
1000 only after the last of them; the server never dies; a good
concurrent SSE stream stays byte-identical to its solo run.
"""

from __future__ import annotations

import base64
import json
import os

import pytest
import websockets.sync.client as ws_client
from hypothesis import example, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosedOK

from tests.server.test_fuzz_http import FUZZ, SEEN, json_values, numbers, run_with_good_stream

EXAMPLES = int(os.environ.get("FUZZ_WS_EXAMPLES", "60"))
RECV_TIMEOUT_S = 30

REALTIME_TYPES = ["session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                  "input_audio_buffer.clear", "conversation.item.create", "conversation.item.retrieve",
                  "conversation.item.truncate", "conversation.item.delete", "response.create", "response.cancel",
                  "output_audio_buffer.clear", "bogus.event"]
short_text = st.text(max_size=30)
audio_b64 = st.binary(max_size=2000).map(lambda b: base64.b64encode(b).decode())
content_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text", "output_text", "input_audio",
                                                               "audio", "bogus"]),
                                      "text": short_text}, optional={"audio": audio_b64, "transcript": short_text})
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "bogus"]),
     "role": st.sampled_from(["user", "assistant", "system", "bogus"]),
     "content": st.lists(content_part, max_size=3)},
    optional={"id": st.text(max_size=12), "status": short_text, "output": short_text, "call_id": short_text})
audio_format = st.one_of(st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw", "bogus"]),
                         st.fixed_dictionaries({"type": st.sampled_from(["audio/pcm", "audio/pcmu", "x"])},
                                               optional={"rate": numbers}))
session = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["realtime", "transcription", "bogus"]),
    "modalities": st.lists(st.sampled_from(["text", "audio", "video"]), max_size=3),
    "output_modalities": st.lists(st.sampled_from(["text", "audio", "video"]), max_size=3),
    "voice": st.sampled_from(["alloy", "nova", "bogus", ""]), "instructions": short_text,
    "output_audio_format": audio_format, "input_audio_format": audio_format, "temperature": numbers,
    "speed": numbers, "max_response_output_tokens": st.one_of(numbers, st.just("inf")),
    "audio": st.fixed_dictionaries({}, optional={
        "output": st.fixed_dictionaries({}, optional={"format": audio_format, "voice": st.sampled_from(["alloy", "x"]),
                                                      "speed": numbers}),
        "input": st.fixed_dictionaries({}, optional={"format": audio_format, "turn_detection": json_values})}),
    "turn_detection": json_values, "tools": json_values,
})
response = st.fixed_dictionaries({}, optional={
    "instructions": short_text, "modalities": st.lists(st.sampled_from(["text", "audio"]), max_size=2),
    "output_modalities": st.lists(st.sampled_from(["text", "audio"]), max_size=2),
    "conversation": st.sampled_from(["auto", "none", "bogus"]), "input": st.lists(item, max_size=2),
    "voice": st.sampled_from(["alloy", "bogus"]), "metadata": json_values})
item_id = st.one_of(st.sampled_from(["item_1", "root", ""]), st.text(max_size=10))
realtime_fields = {
    "session.update": {"session": session},
    "input_audio_buffer.append": {"audio": st.one_of(audio_b64, short_text)},
    "conversation.item.create": {"item": item, "previous_item_id": item_id},
    "conversation.item.retrieve": {"item_id": item_id},
    "conversation.item.truncate": {"item_id": item_id, "content_index": numbers, "audio_end_ms": numbers},
    "conversation.item.delete": {"item_id": item_id},
    "response.create": {"response": response},
}


VALID_REALTIME = [
    {"type": "response.create", "response": {"instructions": "Say hello to everyone here."}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Good morning."}]}},
    {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "nova"}}}},
    {"type": "session.update", "session": {"voice": "alloy", "output_audio_format": "g711_ulaw"}},
    {"type": "response.cancel"},
    {"type": "input_audio_buffer.append", "audio": "AAAAAAAA"},
]


@st.composite
def realtime_event(draw):
    kind = draw(st.integers(0, 12))
    if kind == 0:
        return draw(st.one_of(st.binary(max_size=50), st.text(max_size=50)))  # a raw (likely invalid) frame
    if kind in (1, 2):  # valid events, so deep paths (responses, audio, cancels mid-stream) run too
        return draw(st.sampled_from(VALID_REALTIME))
    event_type = draw(st.sampled_from(REALTIME_TYPES))
    event = {"type": event_type}
    for key, strategy in realtime_fields.get(event_type, {}).items():
        if draw(st.integers(0, 3)):
            event[key] = draw(strategy if draw(st.integers(0, 4)) else json_values)
    if draw(st.booleans()):
        event["event_id"] = draw(st.one_of(st.text(max_size=10), json_values))
    return event


def send_frame(ws, frame) -> None:
    if isinstance(frame, bytes):
        ws.send(frame)
    elif isinstance(frame, str):
        ws.send(frame)
    else:
        ws.send(json.dumps(frame))


def test_fuzz_realtime_events(espeak_server):
    server = espeak_server

    @settings(FUZZ, max_examples=EXAMPLES)
    @given(events=st.lists(realtime_event(), min_size=1, max_size=6), beta=st.booleans())
    @example(events=[VALID_REALTIME[2], VALID_REALTIME[0]], beta=False)  # the success paths always run
    @example(events=[VALID_REALTIME[1], VALID_REALTIME[0], VALID_REALTIME[0]], beta=False)
    @example(events=[VALID_REALTIME[3], VALID_REALTIME[0]], beta=True)
    def check(events, beta):
        headers = dict(server.headers())
        if beta:
            headers["OpenAI-Beta"] = "realtime=v1"
        with ws_client.connect(f"{server.ws_url}/v1/realtime?model=espeak", additional_headers=headers,
                               max_size=None, open_timeout=10) as ws:
            SEEN["realtime", "sessions"] += 1
            first = json.loads(ws.recv(RECV_TIMEOUT_S))
            assert first["type"] == "session.created"
            for frame in events:
                send_frame(ws, frame)
            ws.send(json.dumps({"type": "fuzz.sentinel", "event_id": "sentinel"}))
            created = finished = 0
            sentinel_seen = False
            while not (sentinel_seen and created == finished):  # every response runs to its response.done
                message = ws.recv(RECV_TIMEOUT_S)
                assert isinstance(message, str), "the server sent a binary frame on /v1/realtime"
                event = json.loads(message)
                assert isinstance(event.get("type"), str) and isinstance(event.get("event_id"), str), event
                SEEN["realtime", event["type"]] += 1
                if event["type"] == "error":
                    error = event["error"]
                    assert {"type", "code", "message", "param", "event_id"} <= set(error), error
                    assert isinstance(error["message"], str) and error["message"]
                    assert error["code"] != "server_error", f"a handler raised: {events!r} -> {error}"
                    if error["event_id"] == "sentinel":
                        assert error["code"] == "unknown_event_type"
                        sentinel_seen = True
                created += event["type"] == "response.created"
                finished += event["type"] == "response.done"

    run_with_good_stream(server, check)
    assert SEEN["realtime", "sessions"] >= EXAMPLES // 2, SEEN
    assert SEEN["realtime", "response.done"] >= 3 and SEEN["realtime", "session.updated"] >= 3, SEEN


TEXT_STREAM_TYPES = ["session.config", "input.text", "input.done", "input.cancel", "bogus"]
text_config = st.fixed_dictionaries({}, optional={
    "voice": st.sampled_from(["alloy", "nova", "bogus"]), "language": st.sampled_from(["en", "xx", "auto"]),
    "response_format": st.sampled_from(["pcm", "wav", "mp3"]), "sample_rate": numbers, "speed": numbers,
    "text_split": st.sampled_from(["auto", "none", "sentence", "clause", "bogus"]),
    "ref_audio": st.sampled_from(["", "!!!", "http://127.0.0.1:1/a.wav", "file:///etc/passwd"]),
    "seed": numbers, "instructions": short_text, "model": st.sampled_from(["espeak", "nope"]),
})


@st.composite
def text_stream_event(draw):
    kind = draw(st.integers(0, 12))
    if kind == 0:
        return draw(st.one_of(st.binary(max_size=50), st.text(max_size=50)))
    if kind in (1, 2):
        return draw(st.sampled_from([{"type": "input.text", "text": "Hello there, friend. "}, {"type": "input.done"},
                                     {"type": "session.config", "voice": "nova", "sample_rate": 16000}]))
    event_type = draw(st.sampled_from(TEXT_STREAM_TYPES))
    event = {"type": event_type}
    if event_type == "session.config":
        event.update(draw(text_config))
    elif event_type == "input.text":
        event["text"] = draw(st.one_of(st.text(max_size=40), st.sampled_from(["Hello there. ", "And more, "]),
                                       json_values))
    if kind == 3:
        event[draw(st.text(min_size=1, max_size=6))] = draw(json_values)
    return event


def test_fuzz_text_stream_events(espeak_server):
    server = espeak_server

    @settings(FUZZ, max_examples=EXAMPLES)
    @given(events=st.lists(text_stream_event(), min_size=1, max_size=8))
    @example(events=[{"type": "session.config", "voice": "nova"}, {"type": "input.text", "text": "Hello there. "},
                     {"type": "input.done"}, {"type": "input.text", "text": "And again."}])
    @example(events=[{"type": "input.text", "text": "One, "}, {"type": "input.cancel"},
                     {"type": "input.text", "text": "two."}])
    def check(events):
        with ws_client.connect(f"{server.ws_url}/v1/audio/speech/stream", additional_headers=server.headers(),
                               max_size=None, open_timeout=10) as ws:
            for frame in events:
                send_frame(ws, frame)
            ws.send(json.dumps({"type": "fuzz.sentinel"}))
            ws.send(json.dumps({"type": "session.close"}))  # speaks the open utterance to the end, then closes
            SEEN["text_stream", "sessions"] += 1
            started, done = [], []
            sentinel_seen = False
            with pytest.raises(ConnectionClosedOK) as closed:  # every utterance gets its audio.done before 1000
                while True:
                    message = ws.recv(RECV_TIMEOUT_S)
                    if isinstance(message, bytes):
                        assert len(started) == len(done) + 1, "audio outside an utterance"
                        continue
                    event = json.loads(message)
                    if event["type"] == "audio.start":
                        assert len(started) == len(done)
                        started.append(event["utterance_index"])
                    elif event["type"] == "audio.done":
                        assert started and event["utterance_index"] == started[-1] and len(done) == len(started) - 1
                        assert event["reason"] in ("stop", "length", "cancelled", "error")
                        done.append(event["utterance_index"])
                        SEEN["text_stream", "audio.done"] += 1
                    else:
                        assert event["type"] == "error", event
                        assert isinstance(event["message"], str) and isinstance(event["code"], str), event
                        assert event["code"] != "server_error", f"a handler raised: {events!r} -> {event}"
                        if event["code"] == "unknown_event_type" and "fuzz.sentinel" in event["message"]:
                            sentinel_seen = True
            assert closed.value.rcvd.code == 1000 and sentinel_seen and len(done) == len(started)
            assert started == sorted(started) and len(set(started)) == len(started)

    run_with_good_stream(server, check)
    assert SEEN["text_stream", "sessions"] >= EXAMPLES // 2 and SEEN["text_stream", "audio.done"] >= 3, SEEN

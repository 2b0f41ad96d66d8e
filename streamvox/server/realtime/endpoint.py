"""`WS /v1/realtime`: the OpenAI Realtime protocol (GA and beta dialects) over the engine.

One `RealtimeSession` per connection. Its reader handles client events one at
a time; a response runs in its own task and streams audio deltas while the
reader keeps going, so `response.cancel` (or a new `response.create`, which
barges in) stops it promptly. All sends go through one `Sender`, so events
never interleave mid-frame, and the events of a response are sent by its task
alone, in the upstream order.

Without a thinker the responder is "echo" (it speaks the response's input items, else its instructions, else
the latest user text), and without a speech recogniser `input_audio_buffer.commit` is answered with an error.
With `serve --llm/--llm-url/--asr`, `agent_turns` (called from here through a few hooks) makes the thinker
write the reply, transcribes committed audio and runs server VAD with barge-in. The session object says
which under `"streamvox": {"responder", "thinker", "asr"}`.

Limits (per connection):
- an event is at most 15 MiB (`MAX_EVENT_BYTES`); larger frames up to the
  transport's 16 MiB get an `error` event, beyond that the transport closes
  the connection with 1009;
- the input audio buffer holds at most 15 minutes of audio per turn;
- the conversation keeps the latest 1000 items and at most 64 MiB of
  client-sent base64 audio;
- a response speaks at most 16384 characters;
- with no client event and no running response for 30 minutes
  (`STREAMVOX_REALTIME_IDLE_TIMEOUT_S`), the server sends an `error` event
  (`idle_timeout`) and closes with 1000.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field

import pybase64
from starlette.websockets import WebSocket

from streamvox.audio.resample import Resampler
from streamvox.contract import SpeechRequest
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.engine.events import SLOW_CONSUMER, AudioChunk, Done, EngineError
from streamvox.server.audio_out import SpeechStats
from streamvox.server.metrics import Metrics
from streamvox.server.realtime import turns as agent_turns
from streamvox.server.realtime.protocol import (
    AudioFormat,
    Dialect,
    RealtimeError,
    SessionConfig,
    apply_session_update,
    assistant_content_type,
    default_config,
    event_name,
    item_text,
    new_id,
    parse_modalities,
    parse_voice,
)
from streamvox.server.websocket import (
    OFFLOAD_BYTES,
    FrameError,
    Sender,
    accepted_subprotocol,
    decode_json_event,
    env_seconds,
)

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 15 * 1024 * 1024
MAX_INPUT_AUDIO_SECONDS = 15 * 60
MAX_CONVERSATION_ITEMS = 1000
MAX_STORED_AUDIO_CHARS = 64 * 1024 * 1024
MAX_RESPONSE_CHARS = 16384
DEFAULT_IDLE_TIMEOUT_S = 1800.0
CANCEL_WAIT_S = 5.0  # how long a barge-in waits for the old response to finish its events

_USER_CONTENT = {"input_text", "input_audio", "input_image"}
_ASSISTANT_CONTENT = {"output_text", "output_audio", "text", "audio"}


def _beta_requested(websocket: WebSocket) -> bool:
    for name, value in websocket.scope.get("headers", []):
        if name == b"openai-beta" and b"realtime=v1" in value.replace(b" ", b""):
            return True
    return False


# conversation items


def _audio_chars(item: dict) -> int:
    return sum(len(part.get("audio") or "") for part in item.get("content") or [] if isinstance(part, dict))


def validate_item(item: object, param: str = "item") -> dict:
    """A client-sent conversation item -> its stored form (server-assigned id and status)."""
    if not isinstance(item, dict):
        raise RealtimeError(f"'{param}' must be an object.", param=param, code="missing_required_parameter")
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise RealtimeError(f"'{param}.id' must be a string of 1 to 64 characters.", param=f"{param}.id")
    kind = item.get("type")
    stored: dict = {"id": item_id or new_id("item"), "object": "realtime.item", "type": kind, "status": "completed"}
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            raise RealtimeError(f"'{param}.role' must be user, assistant or system.", param=f"{param}.role")
        content = item.get("content")
        if not isinstance(content, list):
            raise RealtimeError(f"'{param}.content' must be a list.", param=f"{param}.content")
        allowed = _ASSISTANT_CONTENT if role == "assistant" else (
            {"input_text"} if role == "system" else _USER_CONTENT)
        parts = []
        for i, part in enumerate(content):
            where = f"{param}.content[{i}]"
            if not isinstance(part, dict) or part.get("type") not in allowed:
                raise RealtimeError(f"'{where}.type' must be one of {', '.join(sorted(allowed))} for a {role} "
                                    "message.", param=f"{where}.type")
            for key in ("text", "transcript", "audio", "image_url"):
                if part.get(key) is not None and not isinstance(part[key], str):
                    raise RealtimeError(f"'{where}.{key}' must be a string.", param=f"{where}.{key}")
            if part["type"] in ("input_text", "output_text", "text") and not isinstance(part.get("text"), str):
                raise RealtimeError(f"'{where}.text' is required.", param=f"{where}.text",
                                    code="missing_required_parameter")
            parts.append({k: v for k, v in part.items() if k in ("type", "text", "transcript", "audio",
                                                                   "image_url", "detail")})
        stored.update(role=role, content=parts)
    elif kind == "function_call":
        for key in ("name", "arguments"):
            if not isinstance(item.get(key), str):
                raise RealtimeError(f"'{param}.{key}' must be a string.", param=f"{param}.{key}")
        stored.update(name=item["name"], arguments=item["arguments"], call_id=item.get("call_id") or new_id("call"))
    elif kind == "function_call_output":
        for key in ("call_id", "output"):
            if not isinstance(item.get(key), str):
                raise RealtimeError(f"'{param}.{key}' must be a string.", param=f"{param}.{key}")
        stored.update(call_id=item["call_id"], output=item["output"])
    else:
        raise RealtimeError(f"'{param}.type' must be message, function_call or function_call_output.",
                            param=f"{param}.type")
    return stored


class Conversation:
    """The session's ordered items (the newest `MAX_CONVERSATION_ITEMS`)."""

    def __init__(self) -> None:
        self.id = new_id("conv")
        self.items: list[dict] = []
        self.audio_chars = 0
        self.audio_ms: dict[str, int] = {}  # assistant item id -> milliseconds of audio sent

    def index(self, item_id: str) -> int | None:
        for i, item in enumerate(self.items):
            if item["id"] == item_id:
                return i
        return None

    def get(self, item_id: object, param: str = "item_id") -> dict:
        index = self.index(item_id) if isinstance(item_id, str) else None
        if index is None:
            raise RealtimeError(f"Conversation item {item_id!r} does not exist.", code="item_not_found", param=param)
        return self.items[index]

    def insert(self, item: dict, previous_item_id: object = None) -> str | None:
        """Add `item` after `previous_item_id` ("root": first; None: last); the id it now follows."""
        if self.index(item["id"]) is not None:
            raise RealtimeError(f"An item with id '{item['id']}' already exists.", code="duplicate_item_id",
                                param="item.id")
        if self.audio_chars + _audio_chars(item) > MAX_STORED_AUDIO_CHARS:
            raise RealtimeError(f"The conversation holds more than {MAX_STORED_AUDIO_CHARS} bytes of audio; "
                                "delete items first.", code="conversation_audio_limit")
        if previous_item_id is None:
            position = len(self.items)
        elif previous_item_id == "root":
            position = 0
        else:
            index = self.index(previous_item_id) if isinstance(previous_item_id, str) else None
            if index is None:
                raise RealtimeError(f"previous_item_id {previous_item_id!r} does not exist.",
                                    code="item_not_found", param="previous_item_id")
            position = index + 1
        self.items.insert(position, item)
        self.audio_chars += _audio_chars(item)
        while len(self.items) > MAX_CONVERSATION_ITEMS:
            self._forget(self.items.pop(0))
        index = self.index(item["id"])
        return self.items[index - 1]["id"] if index else None

    def replace(self, item: dict) -> None:
        if (index := self.index(item["id"])) is not None:
            self.items[index] = item

    def delete(self, item_id: object) -> None:
        item = self.get(item_id)
        self.items.remove(item)
        self._forget(item)

    def _forget(self, item: dict) -> None:
        self.audio_chars -= _audio_chars(item)
        self.audio_ms.pop(item["id"], None)

    def latest_user_text(self) -> str:
        for item in reversed(self.items):
            if item.get("role") == "user" and (text := item_text(item)):
                return text
        return ""


# responses


@dataclass
class Response:
    id: str
    item_id: str
    text: str
    voice: str
    speed: float
    output_format: AudioFormat
    audio: bool
    in_conversation: bool
    metadata: dict | None
    modalities: list[str]
    request_id: str = field(default_factory=lambda: new_request_id("rt"))
    cancel_reason: str | None = None
    task: asyncio.Task | None = None
    done_sent: bool = False
    # voice agent (agent_turns): a thinker writes the reply from the conversation
    thinker: bool = False
    input_items: list | None = None
    instructions: str = ""
    extra: dict = field(default_factory=dict)  # sent as response.streamvox (timings, thinker state)
    thinker_error: Exception | None = None
    thinker_task: asyncio.Task | None = None


class RealtimeSession:
    def __init__(self, websocket: WebSocket, engine: AsyncEngine, metrics: Metrics, dialect: Dialect,
                 responder=None) -> None:
        self.websocket = websocket
        self.responder = responder  # streamvox.agent.responder.Responder, or None: echo, no ASR
        self.transcriptions: dict[str, asyncio.Task] = {}
        self.vad = None
        self.vad_rate = 0
        self.vad_item_id: str | None = None
        self.engine = engine
        self.info = engine.info
        self.metrics = metrics
        self.dialect = dialect
        self.sender = Sender(websocket, engine.max_buffered_audio_s)
        self.session_id = new_id("sess")
        self.config: SessionConfig = default_config(self.info, websocket.query_params.get("model"))
        self.conversation = Conversation()
        self.input_audio = bytearray()
        self.response: Response | None = None
        self.last_activity = time.monotonic()
        self.idle_timeout_s = env_seconds("STREAMVOX_REALTIME_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)
        self.handlers = {
            "session.update": self.session_update,
            "input_audio_buffer.append": self.input_audio_append,
            "input_audio_buffer.commit": self.input_audio_commit,
            "input_audio_buffer.clear": self.input_audio_clear,
            "conversation.item.create": self.item_create,
            "conversation.item.retrieve": self.item_retrieve,
            "conversation.item.truncate": self.item_truncate,
            "conversation.item.delete": self.item_delete,
            "response.create": self.response_create,
            "response.cancel": self.response_cancel,
            "output_audio_buffer.clear": self.output_audio_clear,
        }

    # plumbing

    async def send(self, event_type: str, **fields) -> bool:
        return await self.sender.json({"type": event_type, "event_id": new_id("event"), **fields})

    async def send_error(self, error: RealtimeError | FrameError, client_event_id: str | None) -> None:
        param = getattr(error, "param", None)
        error_type = getattr(error, "error_type", "invalid_request_error")
        await self.send("error", error={"type": error_type, "code": error.code, "message": error.message,
                                        "param": param, "event_id": client_event_id})

    def session_object(self) -> dict:
        return agent_turns.describe(self, self.config.render(self.dialect, self.session_id, self.info))

    async def run(self) -> None:
        self.metrics.sessions.inc()
        watchdog = asyncio.create_task(self._watch_idle())
        try:
            await self.send("session.created", session=self.session_object())
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self.last_activity = time.monotonic()
                await self._handle(message)
                if self.sender.closed:
                    break
        finally:
            watchdog.cancel()
            agent_turns.close(self)
            await self._stop_response("client_disconnected", wait=False)
            self.metrics.sessions.dec()

    async def _handle(self, message: dict) -> None:
        client_event_id = None
        try:
            event = await decode_json_event(message, MAX_EVENT_BYTES)
            client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            handler = self.handlers.get(event["type"])
            if handler is None:
                raise RealtimeError(f"Unknown event type '{event['type']}'.", code="unknown_event_type",
                                    param="type")
            await handler(event)
        except (RealtimeError, FrameError) as error:
            await self.send_error(error, client_event_id)
        except Exception:  # a bug must not end the session
            log.exception("realtime event handler failed")
            await self.send_error(RealtimeError("The server failed to handle the event.", "server_error",
                                                error_type="server_error"), client_event_id)

    async def _watch_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            if self.response is None and time.monotonic() - self.last_activity > self.idle_timeout_s:
                await self.send_error(RealtimeError(
                    f"The session was idle for {self.idle_timeout_s:g} s and is closed.", "idle_timeout"), None)
                await self.sender.close(1000, "idle timeout")
                return

    # session and input audio

    async def session_update(self, event: dict) -> None:
        self.config = apply_session_update(self.config, event.get("session"), self.info)
        await self.send("session.updated", session=self.session_object())

    async def input_audio_append(self, event: dict) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise RealtimeError("'audio' must be a base64 string.", param="audio", code="missing_required_parameter")
        try:
            data = (await asyncio.to_thread(base64.b64decode, audio, validate=True) if len(audio) > OFFLOAD_BYTES
                    else base64.b64decode(audio, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise RealtimeError("'audio' is not valid base64.", param="audio") from exc
        fmt = self.config.input_format
        if fmt.encoding == "pcm16" and len(data) % 2:
            raise RealtimeError("pcm16 audio must hold a whole number of 2-byte samples.", param="audio")
        limit = fmt.bytes_per_second * MAX_INPUT_AUDIO_SECONDS
        if len(self.input_audio) + len(data) > limit:
            raise RealtimeError(f"The input audio buffer would exceed {MAX_INPUT_AUDIO_SECONDS // 60} minutes of "
                                "audio; commit or clear it first.", code="input_audio_buffer_full", param="audio")
        self.input_audio += data  # upstream sends no acknowledgement
        await agent_turns.on_input_audio(self, data)

    async def input_audio_commit(self, event: dict) -> None:
        if self.responder is not None and self.responder.transcriber is not None:
            await agent_turns.commit_audio(self)
            return
        if not self.input_audio:
            raise RealtimeError("The input audio buffer is empty; append audio before committing.",
                                code="input_audio_buffer_commit_empty")
        seconds = len(self.input_audio) / self.config.input_format.bytes_per_second
        raise RealtimeError(
            f"This server has no speech recogniser or thinker configured, so the {seconds:.2f} s of committed "
            "audio cannot become a user turn. Send text with conversation.item.create instead. The buffer is "
            "unchanged; input_audio_buffer.clear empties it.", code="input_audio_not_supported")

    async def input_audio_clear(self, event: dict) -> None:
        self.input_audio = bytearray()
        if self.vad is not None:
            self.vad.reset()
        await self.send("input_audio_buffer.cleared")

    # conversation

    async def _announce_item(self, item: dict, previous_item_id: str | None) -> None:
        if self.dialect is Dialect.GA:
            await self.send("conversation.item.added", previous_item_id=previous_item_id, item=item)
            await self.send("conversation.item.done", previous_item_id=previous_item_id, item=item)
        else:
            await self.send("conversation.item.created", previous_item_id=previous_item_id, item=item)

    async def item_create(self, event: dict) -> None:
        item = validate_item(event.get("item"))
        previous = self.conversation.insert(item, event.get("previous_item_id"))
        await self._announce_item(item, previous)

    async def item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(event.get("item_id"))
        await self.send("conversation.item.retrieved", item=item)

    async def item_delete(self, event: dict) -> None:
        item_id = event.get("item_id")
        self.conversation.delete(item_id)
        await self.send("conversation.item.deleted", item_id=item_id)

    async def item_truncate(self, event: dict) -> None:
        item = self.conversation.get(event.get("item_id"))
        content_index, audio_end_ms = event.get("content_index", 0), event.get("audio_end_ms")
        if item.get("role") != "assistant":
            raise RealtimeError("Only assistant messages can be truncated.", param="item_id")
        if isinstance(content_index, bool) or not isinstance(content_index, int) \
                or not 0 <= content_index < len(item["content"]) \
                or item["content"][content_index].get("type") not in ("output_audio", "audio"):
            raise RealtimeError("'content_index' must point at an audio content part.", param="content_index")
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
            raise RealtimeError("'audio_end_ms' must be a non-negative integer.", param="audio_end_ms",
                                code="missing_required_parameter" if audio_end_ms is None else "invalid_value")
        available = self.conversation.audio_ms.get(item["id"], 0)
        if audio_end_ms > available:
            raise RealtimeError(f"The item holds {available} ms of audio, less than audio_end_ms={audio_end_ms}.",
                                param="audio_end_ms")
        self.conversation.audio_ms[item["id"]] = audio_end_ms
        item["content"][content_index]["transcript"] = ""  # upstream drops the transcript of truncated audio
        await self.send("conversation.item.truncated", item_id=item["id"], content_index=content_index,
                        audio_end_ms=audio_end_ms)

    # responses

    def _response_text(self, params: dict) -> str:
        """What the echo responder speaks: input items, else instructions, else the latest user text."""
        items = params.get("input")
        if items is not None:
            if not isinstance(items, list):
                raise RealtimeError("'response.input' must be a list of items.", param="response.input")
            texts = []
            for i, entry in enumerate(items):
                if isinstance(entry, dict) and entry.get("type") == "item_reference":
                    entry = self.conversation.get(entry.get("id"), f"response.input[{i}].id")
                else:
                    entry = validate_item(entry, f"response.input[{i}]")
                if text := item_text(entry):
                    texts.append((entry.get("role") == "user", text))
            user = [text for is_user, text in texts if is_user]
            if user or texts:
                return (user or [text for _, text in texts])[-1]
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RealtimeError("'response.instructions' must be a string.", param="response.instructions")
        if instructions and instructions.strip():
            return instructions.strip()
        return self.conversation.latest_user_text()

    def _new_response(self, params: object) -> Response:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RealtimeError("'response' must be an object.", param="response")
        config = self.config
        audio, modalities = config.audio_output, config.modalities(self.dialect)
        for key in ("output_modalities", "modalities"):
            if (value := params.get(key)) is not None:
                audio, _ = parse_modalities(value, f"response.{key}")
                modalities = value
        voice, output_format = config.voice, config.output_format
        out = (params.get("audio") or {}).get("output") if isinstance(params.get("audio"), dict) else None
        if isinstance(out, dict):
            if out.get("voice") is not None:
                voice = parse_voice(out["voice"], self.info, "response.audio.output.voice")
            if out.get("format") is not None:
                output_format = AudioFormat.parse(out["format"], "response.audio.output.format")
        if params.get("voice") is not None:
            voice = parse_voice(params["voice"], self.info, "response.voice")
        if params.get("output_audio_format") is not None:
            output_format = AudioFormat.parse(params["output_audio_format"], "response.output_audio_format")
        conversation = params.get("conversation", "auto")
        if conversation not in ("auto", "none"):
            raise RealtimeError("'response.conversation' must be 'auto' or 'none'.", param="response.conversation")
        metadata = params.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise RealtimeError("'response.metadata' must be an object.", param="response.metadata")
        if self.responder is not None and self.responder.thinker is not None:
            return self._new_thinker_response(params, voice, output_format, audio, conversation, metadata,
                                              modalities)
        text = self._response_text(params)
        if len(text) > MAX_RESPONSE_CHARS:
            raise RealtimeError(f"The text to speak is longer than {MAX_RESPONSE_CHARS} characters.",
                                param="response")
        return Response(id=new_id("resp"), item_id=new_id("item"), text=text, voice=voice, speed=config.speed,
                        output_format=output_format, audio=audio, in_conversation=conversation == "auto",
                        metadata=metadata, modalities=modalities)

    def _new_thinker_response(self, params: dict, voice, output_format, audio, conversation, metadata,
                              modalities) -> Response:
        items = params.get("input")
        if items is not None:
            if not isinstance(items, list):
                raise RealtimeError("'response.input' must be a list of items.", param="response.input")
            items = [entry if isinstance(entry, dict) and entry.get("type") == "item_reference"
                     else validate_item(entry, f"response.input[{i}]") for i, entry in enumerate(items)]
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RealtimeError("'response.instructions' must be a string.", param="response.instructions")
        return Response(id=new_id("resp"), item_id=new_id("item"), text="", voice=voice, speed=self.config.speed,
                        output_format=output_format, audio=audio, in_conversation=conversation == "auto",
                        metadata=metadata, modalities=modalities, thinker=True, input_items=items,
                        instructions=instructions if instructions is not None else self.config.instructions)

    async def response_create(self, event: dict) -> None:
        response = self._new_response(event.get("response"))
        await self._stop_response("client_cancelled")  # barge-in: the running response ends first
        self.response = response
        # announced before the next client event is read, so events answer the client's in the order it sent them
        await self.send("response.created", response=self._response_object(response, "in_progress", []))
        response.task = asyncio.create_task(self._respond(response))

    async def response_cancel(self, event: dict) -> None:
        response_id = event.get("response_id")
        if self.response is None or (response_id is not None and response_id != self.response.id):
            raise RealtimeError("There is no active response to cancel" + (
                f" with id {response_id!r}." if response_id is not None else "."),
                code="response_cancel_not_active")
        await self._stop_response("client_cancelled")

    async def output_audio_clear(self, event: dict) -> None:
        """WebSocket clients hold the audio already sent; clearing stops the running response."""
        response_id = self.response.id if self.response is not None else None
        await self._stop_response("client_cancelled")
        await self.send("output_audio_buffer.cleared", response_id=response_id)

    async def _stop_response(self, reason: str, wait: bool = True) -> None:
        response = self.response
        if response is None or response.task is None:
            return
        if response.cancel_reason is None:
            response.cancel_reason = reason
            self.engine.cancel(response.request_id)
            if response.thinker_task is not None:  # a text-only thinker response: stop its LLM request
                response.thinker_task.cancel()
        if not wait:
            response.task.cancel()
            return
        try:
            await asyncio.wait_for(asyncio.shield(response.task), CANCEL_WAIT_S)
        except TimeoutError:  # stuck behind a client that does not read: end it here
            log.warning("response %s did not stop within %g s (the client is not reading); cancelling it",
                        response.id, CANCEL_WAIT_S)
            response.task.cancel()
            await asyncio.wait([response.task])
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("response task failed")
        if not response.done_sent:
            response.done_sent = True
            details = {"type": "cancelled", "reason": response.cancel_reason}
            await self.send("response.done", response=self._response_object(
                response, "cancelled", [], _usage(len(response.text.split()), 0), details))

    def _response_object(self, r: Response, status: str, output: list[dict], usage: dict | None = None,
                         status_details: dict | None = None) -> dict:
        body: dict = {"object": "realtime.response", "id": r.id, "status": status, "status_details": status_details,
                      "output": output, "conversation_id": self.conversation.id if r.in_conversation else None,
                      "usage": usage, "metadata": r.metadata}
        if r.extra:
            body["streamvox"] = r.extra
        if self.dialect is Dialect.GA:
            body.update(output_modalities=r.modalities, max_output_tokens=self.config.max_output_tokens,
                        audio={"output": {"format": r.output_format.render(self.dialect), "voice": r.voice}})
        else:
            body.update(modalities=r.modalities, voice=r.voice, temperature=self.config.temperature,
                        output_audio_format=r.output_format.render(self.dialect),
                        max_output_tokens=self.config.max_output_tokens)
        return body

    async def _respond(self, r: Response) -> None:
        try:
            await self._run_response(r)
        except Exception:  # a bug: the client still learns that the response ended
            log.exception("response %s failed", r.id)
            if not r.done_sent:
                r.done_sent = True
                details = {"type": "failed", "error": {"type": "server_error", "code": "server_error",
                                                       "message": "The server failed while responding."}}
                await self.send("response.done", response=self._response_object(r, "failed", [], _usage(0, 0),
                                                                                 details))
        finally:
            if self.response is r:
                self.response = None
                self.last_activity = time.monotonic()

    async def _run_response(self, r: Response) -> None:
        d = self.dialect
        content_type = assistant_content_type(d, r.audio)
        item = {"id": r.item_id, "object": "realtime.item", "type": "message", "status": "in_progress",
                "role": "assistant", "content": []}
        await self.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
        previous = None
        if r.in_conversation:
            previous = self.conversation.insert(dict(item))
            name = "conversation.item.added" if d is Dialect.GA else "conversation.item.created"
            await self.send(name, previous_item_id=previous, item=item)
        ids = {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}
        part = {"type": "audio", "transcript": ""} if r.audio else {"type": "text", "text": ""}
        await self.send("response.content_part.added", **ids, part=part)

        if r.thinker:
            think = agent_turns.think_and_speak if r.audio else agent_turns.think_text
            status, details, usage, spoken = await think(self, r, ids)
        elif not r.text:
            status, details, usage = "failed", {"type": "failed", "error": {
                "type": "invalid_request_error", "code": "no_input_text",
                "message": "There is no text to speak: add a user message with conversation.item.create, or give "
                           "response.input or response.instructions."}}, _usage(0, 0)
            spoken = ""
        elif r.audio:
            status, details, usage, spoken = await self._stream_audio(r, ids)
        else:
            status, details, usage, spoken = await self._stream_text(r, ids)

        if r.audio:
            await self.send(event_name(d, "audio.done"), **ids)
            await self.send(event_name(d, "transcript.done"), **ids, transcript=spoken)
            part = {"type": "audio", "transcript": spoken}
            content = {"type": content_type, "transcript": spoken}
        else:
            await self.send(event_name(d, "text.done"), **ids, text=spoken)
            part = {"type": "text", "text": spoken}
            content = {"type": content_type, "text": spoken}
        await self.send("response.content_part.done", **ids, part=part)
        item = {**item, "status": "completed" if status == "completed" else "incomplete", "content": [content]}
        await self.send("response.output_item.done", response_id=r.id, output_index=0, item=item)
        if r.in_conversation:
            self.conversation.replace(dict(item, content=[dict(content)]))
            if d is Dialect.GA:
                await self.send("conversation.item.done", previous_item_id=previous, item=item)
        if not (r.audio and r.text) and not r.thinker:  # audio responses are counted by their SpeechStats
            self.metrics.requests.labels("realtime", status).inc()
        r.done_sent = True
        await self.send("response.done", response=self._response_object(r, status, [item], usage, details))

    async def _stream_text(self, r: Response, ids: dict) -> tuple[str, dict | None, dict, str]:
        if r.cancel_reason is not None:
            return "cancelled", {"type": "cancelled", "reason": r.cancel_reason}, _usage(0, 0), ""
        await self.send(event_name(self.dialect, "text.delta"), **ids, delta=r.text)
        return "completed", None, _usage(len(r.text.split()), 0, text_out=len(r.text.split())), r.text

    async def _stream_audio(self, r: Response, ids: dict) -> tuple[str, dict | None, dict, str]:
        """Speak `r.text`, sending deltas until done, failed or cancelled."""
        fmt = r.output_format
        resampler = Resampler(self.info.sample_rate, fmt.rate)
        stats = SpeechStats(self.metrics, "realtime")
        delta_name = event_name(self.dialect, "audio.delta")
        chunks, audio_bytes, spoken = 0, 0, ""
        words = len(r.text.split())
        status, details, n_in, n_out = "cancelled", None, words, 0

        async def send_audio(data: bytes) -> None:
            nonlocal audio_bytes, spoken
            if not data:
                return
            await self.send(delta_name, **ids, delta=pybase64.b64encode_as_string(data))
            audio_bytes += len(data)
            if r.in_conversation:
                self.conversation.audio_ms[r.item_id] = audio_bytes * 1000 // fmt.bytes_per_second
            if not spoken:  # no word timings: the transcript follows the first audio
                spoken = r.text
                await self.send(event_name(self.dialect, "transcript.delta"), **ids, delta=r.text)

        if r.cancel_reason is None:
            request = SpeechRequest(request_id=r.request_id, text=r.text, voice=r.voice, speed=r.speed)
            async with aclosing(self.engine.submit(request)) as events:
                async for event in events:
                    if r.cancel_reason is not None:
                        break
                    match event:
                        case AudioChunk(pcm=pcm):
                            chunks += 1
                            stats.audio(len(pcm))
                            await send_audio(fmt.encode(resampler.process(pcm)))
                            if self.sender.stalled:
                                status, details = "failed", agent_turns.failure_details(SLOW_CONSUMER)
                                break
                            # Neither a non-empty engine queue nor an unpaused socket suspends this task;
                            # yield so the loop reads client events (a cancel) between deltas.
                            await asyncio.sleep(0)
                        case Done(reason="cancelled"):
                            break
                        case Done() as done:
                            await send_audio(fmt.encode(resampler.flush()))
                            n_in, n_out = done.input_tokens, done.output_tokens
                            status = "completed" if done.reason == "stop" else "incomplete"
                            if status == "incomplete":
                                details = {"type": "incomplete", "reason": "max_output_tokens"}
                        case EngineError() as error:
                            status = "failed"
                            details = {"type": "failed", "error": {
                                "type": "invalid_request_error" if error.is_request_error else "server_error",
                                "code": error.code, "message": error.message}}
        if status == "cancelled":
            details = {"type": "cancelled", "reason": r.cancel_reason or "client_cancelled"}
            n_out = chunks
        stats.end("ok" if status == "completed" else status, self.info.sample_rate)
        return status, details, _usage(n_in, n_out), spoken


def _usage(input_tokens: int, audio_out: int, text_out: int = 0) -> dict:
    return {"total_tokens": input_tokens + audio_out + text_out, "input_tokens": input_tokens,
            "output_tokens": audio_out + text_out,
            "input_token_details": {"text_tokens": input_tokens, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}}


async def realtime_endpoint(websocket: WebSocket) -> None:
    """`WS /v1/realtime`; auth is the API-key middleware's job, before this runs."""
    state = websocket.app.state.streamvox
    if state.engine.info is None or not state.engine.is_ready:
        await websocket.close(1013, "the speech engine is not ready")
        return
    await websocket.accept(subprotocol=accepted_subprotocol(websocket, "realtime"))
    dialect = Dialect.BETA if _beta_requested(websocket) else Dialect.GA
    session = RealtimeSession(websocket, state.engine, state.metrics, dialect, getattr(state, "responder", None))
    await session.sender.serve(session.run())

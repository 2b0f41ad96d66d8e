"""Running a Realtime response: its events from `response.created` to `response.done`, and the echo responder.

A response runs in a task of its own and streams its content while the session reads client events, so
`response.cancel` (or a new `response.create`, which barges in) stops it promptly; its events are sent by its
task alone, in the upstream order. At most one response runs per session.

Without a thinker the content comes from the echo responder: it speaks (or writes) the response's input
items, else its instructions, else the latest user text. With one, `turns.ThinkerReplies` writes it, handed
in as a `Thinking` so that this module does not import turns.py (which imports it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import pybase64

from streamvox.agent.errors import StageError
from streamvox.agent.turn_state import ThinkerReply
from streamvox.contract import SpeechRequest, WordTimings
from streamvox.engine.client import new_request_id
from streamvox.engine.events import SLOW_CONSUMER, EngineError
from streamvox.server.audio_out import AudioOut, SpeechResult, SpeechStats
from streamvox.server.errors import APIError
from streamvox.server.realtime.protocol import (
    AudioFormat,
    Dialect,
    assistant_content_type,
    item_text,
    new_id,
    parse_modalities,
    parse_voice,
)
from streamvox.server.realtime.session import SessionState
from streamvox.server.realtime.spoken_words import WordDeltas

log = logging.getLogger(__name__)

MAX_RESPONSE_CHARS = 16384
CANCEL_WAIT_S = 5.0  # how long a barge-in waits for the old response to finish its events


def usage(*, input_text: int = 0, output_text: int = 0, output_audio: int = 0) -> dict:
    """The `usage` of `response.done`, in tokens (the echo responder counts words)."""
    return {"total_tokens": input_text + output_text + output_audio, "input_tokens": input_text,
            "output_tokens": output_text + output_audio,
            "input_token_details": {"text_tokens": input_text, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": output_text, "audio_tokens": output_audio}}


def failed(error: EngineError | StageError) -> dict:
    """`status_details` of a response that failed with `error`."""
    kind = "invalid_request_error" if isinstance(error, EngineError) and error.is_request_error else "server_error"
    return {"type": "failed", "error": {"type": kind, "code": error.code, "message": error.message}}


def cancelled(reason: str | None) -> dict:
    return {"type": "cancelled", "reason": reason or "client_cancelled"}


@dataclass
class Outcome:
    """How a response's content ended: `response.done`'s status, status_details and usage, and what was said."""

    status: str
    details: dict | None
    usage: dict
    transcript: str


@dataclass
class Response:
    id: str
    item_id: str
    voice: str
    speed: float
    output_format: AudioFormat
    audio: bool
    in_conversation: bool
    metadata: dict | None
    modalities: list[str]
    text: str = ""  # what the echo responder says
    word_timestamps: bool = False  # one transcript delta per word, with its start_time (spoken_words.py)
    thinker: ThinkerReply | None = None  # set when the thinker writes the content
    request_id: str = field(default_factory=lambda: new_request_id("rt"))  # the engine request (audio)
    cancel_reason: str | None = None
    task: asyncio.Task | None = None
    done_sent: bool = False
    audio_ms: int = 0  # audio sent so far
    audio_started_at: float | None = None  # when its first audio was sent (monotonic)
    cut_ms: int | None = None  # where a barge-in or the client's truncate cut it: the user heard no more

    def played_ms(self, now: float) -> int:
        """The most of its audio the client can have played by `now`: it plays in real time from the first
        delta on, and audio is made faster than that."""
        if self.audio_started_at is None:
            return 0
        return min(self.audio_ms, int((now - self.audio_started_at) * 1000))


class Thinking(Protocol):
    """What writes a response's content with the thinker (turns.ThinkerReplies)."""

    def prepare(self, response: Response, params: dict) -> None:
        """Check the thinker's parameters of `response.create` and set `response.thinker`."""

    async def speak(self, response: Response, ids: dict) -> Outcome: ...

    async def write(self, response: Response, ids: dict) -> Outcome: ...


async def send_audio(s: SessionState, r: Response, ids: dict, out: AudioOut,
                     on_first_audio: Callable[[], Awaitable[None]] | None = None,
                     on_words: Callable[[WordTimings], Awaitable[None]] | None = None) -> int:
    """Send `out`'s audio as `r`'s deltas until it ends, `r` is cancelled or the client stops reading (the
    request then fails as a slow consumer); the number of engine deltas. `on_first_audio` runs once the first
    delta is out; `on_words` (a request with word timestamps) with each word timing, which covers audio sent."""
    fmt = r.output_format
    name = s.event_name("audio.delta")
    deltas, audio_bytes = 0, 0
    async for pcm in out.deltas() if on_words is None else out.stream():
        if isinstance(pcm, WordTimings):
            await on_words(pcm)
            continue
        if r.cancel_reason is not None:
            break
        deltas += 1
        if data := fmt.encode(pcm):
            await s.send(name, **ids, delta=pybase64.b64encode_as_string(data))
            first = audio_bytes == 0
            if first:
                r.audio_started_at = time.monotonic()
            audio_bytes += len(data)
            r.audio_ms = audio_bytes * 1000 // fmt.bytes_per_second
            if r.in_conversation and s.conversation.index(r.item_id) is not None:  # (not deleted meanwhile)
                s.conversation.audio_ms[r.item_id] = r.audio_ms
            if first and on_first_audio is not None:
                await on_first_audio()
        if s.sender.stalled:
            out.fail(SLOW_CONSUMER)
            break
    return deltas


def audio_status(r: Response, result: SpeechResult) -> tuple[str, dict | None]:
    """The status and status_details of a response whose audio ended with `result`."""
    if r.cancel_reason is not None or result.status == "cancelled":
        return "cancelled", cancelled(r.cancel_reason)
    if result.status == "failed":
        return "failed", failed(result.error)
    if result.status == "incomplete":
        return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
    return "completed", None


class Responses:
    """A session's responses: `create` starts one (stopping the one running), `stop` ends it."""

    def __init__(self, session: SessionState, thinking: Thinking | None = None) -> None:
        self.session = session
        self.thinking = thinking
        self.current: Response | None = None
        self.latest: Response | None = None  # the newest response, running or not (its audio may still play)
        self.ended_at = time.monotonic()  # when the last response ended

    # starting and stopping

    def parse(self, params: object) -> Response:
        """A `response.create`'s `response` -> a Response to run; raises `APIError`."""
        s = self.session
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise APIError(400, "'response' must be an object.", param="response")
        config = s.config
        audio, modalities = config.audio_output, config.modalities(s.dialect)
        for key in ("output_modalities", "modalities"):
            if (value := params.get(key)) is not None:
                audio, _ = parse_modalities(value, f"response.{key}")
                modalities = value
        voice, output_format = config.voice, config.output_format
        out = (params.get("audio") or {}).get("output") if isinstance(params.get("audio"), dict) else None
        if isinstance(out, dict):
            if out.get("voice") is not None:
                voice = parse_voice(out["voice"], s.info, "response.audio.output.voice")
            if out.get("format") is not None:
                output_format = AudioFormat.parse(out["format"], "response.audio.output.format")
        if params.get("voice") is not None:
            voice = parse_voice(params["voice"], s.info, "response.voice")
        if params.get("output_audio_format") is not None:
            output_format = AudioFormat.parse(params["output_audio_format"], "response.output_audio_format")
        conversation = params.get("conversation", "auto")
        if conversation not in ("auto", "none"):
            raise APIError(400, "'response.conversation' must be 'auto' or 'none'.", param="response.conversation")
        metadata = params.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise APIError(400, "'response.metadata' must be an object.", param="response.metadata")
        response = Response(id=new_id("resp"), item_id=new_id("item"), voice=voice, speed=config.speed,
                            output_format=output_format, audio=audio, in_conversation=conversation == "auto",
                            metadata=metadata, modalities=modalities,
                            word_timestamps=audio and config.word_timestamps)
        if self.thinking is not None:
            self.thinking.prepare(response, params)
        else:
            response.text = self._echo_script(params)
            if len(response.text) > MAX_RESPONSE_CHARS:
                raise APIError(400, f"The text to speak is longer than {MAX_RESPONSE_CHARS} characters.",
                               param="response")
        return response

    def _echo_script(self, params: dict) -> str:
        """What the echo responder says: the input items, else the instructions, else the latest user text."""
        items = self.session.conversation.input_items(params.get("input"))
        if items is not None:
            texts = [(item.get("role") == "user", text) for item in items if (text := item_text(item))]
            user = [text for is_user, text in texts if is_user]
            if user or texts:
                return (user or [text for _, text in texts])[-1]
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise APIError(400, "'response.instructions' must be a string.", param="response.instructions")
        if instructions and instructions.strip():
            return instructions.strip()
        return self.session.conversation.latest_user_text()

    async def create(self, params: object) -> None:
        """Start a response; the running one (if any) ends first."""
        response = self.parse(params)
        await self.stop("client_cancelled")  # barge-in
        self.current = self.latest = response
        # announced before the next client event is read, so events answer the client's in the order it sent them
        await self.session.send("response.created", response=self.render(response, "in_progress", []))
        response.task = asyncio.create_task(self._respond(response))

    def cancel(self, reason: str) -> None:
        """Cancel the running response's generation now; `stop` waits for its last events."""
        response = self.current
        if response is None or response.task is None or response.cancel_reason is not None:
            return
        response.cancel_reason = reason
        self.session.engine.cancel(response.request_id)
        if response.thinker is not None and response.thinker.task is not None:
            response.thinker.task.cancel()  # a text-only thinker reply: stop its LLM request

    async def stop(self, reason: str, wait: bool = True) -> None:
        """End the running response (with `reason`); with `wait`, once its events are out."""
        response = self.current
        if response is None or response.task is None:
            return
        self.cancel(reason)
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
            await self.session.send("response.done", response=self.render(
                response, "cancelled", [], usage(input_text=len(response.text.split())),
                cancelled(response.cancel_reason)))

    # running

    def render(self, r: Response, status: str, output: list[dict], tokens: dict | None = None,
               status_details: dict | None = None) -> dict:
        """The response object of `response.created` / `response.done`, in the session's dialect."""
        s = self.session
        body: dict = {"object": "realtime.response", "id": r.id, "status": status, "status_details": status_details,
                      "output": output, "conversation_id": s.conversation.id if r.in_conversation else None,
                      "usage": tokens, "metadata": r.metadata}
        if r.thinker is not None and r.thinker.report:
            body["streamvox"] = r.thinker.report
        if s.dialect is Dialect.GA:
            body.update(output_modalities=r.modalities, max_output_tokens=s.config.max_output_tokens,
                        audio={"output": {"format": r.output_format.render(s.dialect), "voice": r.voice}})
        else:
            body.update(modalities=r.modalities, voice=r.voice, temperature=s.config.temperature,
                        output_audio_format=r.output_format.render(s.dialect),
                        max_output_tokens=s.config.max_output_tokens)
        return body

    async def _respond(self, r: Response) -> None:
        try:
            await self._run(r)
        except Exception:  # a bug: the client still learns that the response ended
            log.exception("response %s failed", r.id)
            if not r.done_sent:
                r.done_sent = True
                details = {"type": "failed", "error": {"type": "server_error", "code": "server_error",
                                                       "message": "The server failed while responding."}}
                await self.session.send("response.done", response=self.render(r, "failed", [], usage(), details))
        finally:
            if self.current is r:
                self.current = None
                self.ended_at = time.monotonic()

    async def _run(self, r: Response) -> None:
        s = self.session
        item = {"id": r.item_id, "object": "realtime.item", "type": "message", "status": "in_progress",
                "role": "assistant", "content": []}
        await s.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
        previous = None
        if r.in_conversation:
            previous = s.conversation.insert(dict(item))
            name = "conversation.item.added" if s.dialect is Dialect.GA else "conversation.item.created"
            await s.send(name, previous_item_id=previous, item=item)
        ids = {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}
        part = {"type": "audio", "transcript": ""} if r.audio else {"type": "text", "text": ""}
        await s.send("response.content_part.added", **ids, part=part)

        if r.thinker is not None:
            outcome = await (self.thinking.speak if r.audio else self.thinking.write)(r, ids)
        elif not r.text:
            outcome = Outcome("failed", {"type": "failed", "error": {
                "type": "invalid_request_error", "code": "no_input_text",
                "message": "There is no text to speak: add a user message with conversation.item.create, or give "
                           "response.input or response.instructions."}}, usage(), "")
        elif r.audio:
            outcome = await self._echo_audio(r, ids)
        else:
            outcome = await self._echo_text(r, ids)
        if not (r.audio and (r.text or r.thinker is not None)):  # engine requests are counted by their SpeechStats
            s.metrics.requests.labels("realtime", SpeechResult(outcome.status).metrics_status).inc()

        spoken = outcome.transcript
        content_type = assistant_content_type(s.dialect, r.audio)
        if r.audio:
            await s.send(s.event_name("audio.done"), **ids)
            await s.send(s.event_name("transcript.done"), **ids, transcript=spoken)
            part = {"type": "audio", "transcript": spoken}
            content = {"type": content_type, "transcript": spoken}
        else:
            await s.send(s.event_name("text.done"), **ids, text=spoken)
            part = {"type": "text", "text": spoken}
            content = {"type": content_type, "text": spoken}
        await s.send("response.content_part.done", **ids, part=part)
        item = {**item, "status": "completed" if outcome.status == "completed" else "incomplete", "content": [content]}
        await s.send("response.output_item.done", response_id=r.id, output_index=0, item=item)
        if r.in_conversation and s.conversation.index(r.item_id) is not None:  # (the client may have deleted it)
            s.conversation.replace(dict(item, content=[dict(content)]))
            if s.dialect is Dialect.GA:
                await s.send("conversation.item.done", previous_item_id=previous, item=item)
        r.done_sent = True
        await s.send("response.done", response=self.render(r, outcome.status, [item], outcome.usage,
                                                           outcome.details))

    # the echo responder

    async def _echo_text(self, r: Response, ids: dict) -> Outcome:
        if r.cancel_reason is not None:
            return Outcome("cancelled", cancelled(r.cancel_reason), usage(), "")
        await self.session.send(self.session.event_name("text.delta"), **ids, delta=r.text)
        words = len(r.text.split())
        return Outcome("completed", None, usage(input_text=words, output_text=words), r.text)

    async def _echo_audio(self, r: Response, ids: dict) -> Outcome:
        """Speak `r.text`; its transcript is sent after the first audio, or word by word with word timestamps."""
        s = self.session
        stats = SpeechStats(s.metrics, "realtime")
        words = len(r.text.split())
        spoken = ""
        if r.cancel_reason is not None:
            stats.end("cancelled", r.output_format.rate)
            return Outcome("cancelled", cancelled(r.cancel_reason), usage(input_text=words), spoken)

        async def transcript() -> None:
            nonlocal spoken
            spoken = r.text
            await s.send(s.event_name("transcript.delta"), **ids, delta=r.text)

        by_word = WordDeltas(s, ids, lambda: r.text) if r.word_timestamps else None
        request = SpeechRequest(request_id=r.request_id, text=r.text, voice=r.voice, speed=r.speed,
                                sample_rate=r.output_format.rate, word_timestamps=r.word_timestamps)
        async with AudioOut(s.engine, request, stats) as out:
            if by_word is None:
                deltas = await send_audio(s, r, ids, out, transcript)
            else:
                deltas = await send_audio(s, r, ids, out, on_words=by_word.send)
        status, details = audio_status(r, out.result)
        if by_word is not None:
            spoken = await by_word.finish(status == "completed")
            if r.in_conversation:
                by_word.remember(s.conversation, r.item_id)
        if status == "cancelled":
            tokens = usage(input_text=words, output_audio=deltas)
        elif status == "failed":
            tokens = usage(input_text=words)
        else:
            done = out.result.done
            tokens = usage(input_text=done.input_tokens, output_audio=done.output_tokens)
        return Outcome(status, details, tokens, spoken)

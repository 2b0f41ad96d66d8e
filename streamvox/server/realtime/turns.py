"""Voice-agent turns on `/v1/realtime`: thinker responses, input audio turns (transcribed), server VAD and barge-in.

A thinker response runs two things at once: the thinker's token stream, each delta fed into the talker
(`engine.feed_text`) and sent as a transcript delta as soon as it is generated, and the talker's audio, sent
as audio deltas as soon as they are decoded. So speech starts after the first clause, long before the thinker
has finished; `engine.end_input` marks the text done when the thinker finishes. Cancelling the response
(`response.cancel`, a new `response.create`, or speech starting under server VAD) cancels the talker request
and closes the thinker's stream, which aborts its LLM request.

Committed input audio becomes a user item whose transcript arrives in the background (a thinker response
waits for the transcriptions in flight). Server VAD commits the turn when the user stops speaking (its response
is created once the transcript is in, and not at all when it is empty), and when they start again interrupts
the reply they are hearing: cancelled if still generated, cut at what can have been played if its audio is
still playing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing

import numpy as np

from streamvox.agent.asr import Transcriber
from streamvox.agent.errors import StageError
from streamvox.agent.responder import Responder
from streamvox.agent.turn_state import ThinkerReply, TurnState
from streamvox.agent.vad import VadEvent, VadSettings
from streamvox.audio.g711 import alaw_to_pcm16, ulaw_to_pcm16
from streamvox.contract import SpeechRequest
from streamvox.engine.client import new_request_id
from streamvox.engine.events import EngineError
from streamvox.server.audio_out import AudioOut, SpeechStats
from streamvox.server.errors import APIError
from streamvox.server.realtime.protocol import AudioFormat, item_text, new_id
from streamvox.server.realtime.responses import (
    Outcome,
    Response,
    Responses,
    audio_status,
    cancelled,
    failed,
    send_audio,
    usage,
)
from streamvox.server.realtime.session import SessionState
from streamvox.server.realtime.spoken_words import WordDeltas, heard_transcript

log = logging.getLogger(__name__)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def nothing_to_answer() -> Outcome:
    """A response.create with no instructions and no words in the conversation (e.g. only an audio turn whose
    transcript is empty): the thinker is not asked, and the client learns why."""
    return Outcome("failed", {"type": "failed", "error": {
        "type": "invalid_request_error", "code": "no_input",
        "message": "There is nothing to answer: the conversation holds no text (an audio turn's transcript may be "
                   "empty) and there are no instructions."}}, usage(), "")


def chat_history(items: list[dict]) -> list[dict]:
    """Conversation items -> chat messages (function calls are shown to the thinker as text)."""
    messages = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            if text := item_text(item):
                messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": f"[call {item['name']}({item['arguments']})]"})
        elif kind == "function_call_output":
            messages.append({"role": "user", "content": f"[result: {item['output']}]"})
    return messages


async def _stop_pump(pump: asyncio.Task) -> None:
    if not pump.done():
        pump.cancel()
    try:
        await pump
    except asyncio.CancelledError:
        if not pump.cancelled():
            raise
    except Exception:
        log.exception("thinker pump failed")


class ThinkerReplies:
    """Responses the thinker writes (`responses.Thinking`): spoken as it writes them, or sent as text."""

    def __init__(self, session: SessionState, responder: Responder, turns: TurnState) -> None:
        self.session = session
        self.responder = responder
        self.thinker = responder.thinker
        self.turns = turns

    def prepare(self, response: Response, params: dict) -> None:
        items = self.session.conversation.input_items(params.get("input"), resolve=False)
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise APIError(400, "'response.instructions' must be a string.", param="response.instructions")
        response.thinker = ThinkerReply(
            instructions=instructions if instructions is not None else self.session.config.instructions,
            input_items=items)

    async def _messages(self, r: Response) -> list[dict]:
        """The thinker's prompt, once the turn's pending transcriptions are done."""
        await self.turns.transcribed()
        conversation = self.session.conversation
        if r.thinker.input_items is not None:
            items = conversation.resolve(r.thinker.input_items)
        else:
            items = [item for item in conversation.items if item["id"] != r.item_id]
        return self.responder.messages(chat_history(items), r.thinker.instructions)

    async def _pump(self, r: Response, messages: list[dict], ids: dict, spoken: list[str], t0: float,
                    feed: bool) -> None:
        """Thinker deltas -> talker text (with `feed`) and transcript (or text) deltas; end the talker's input
        when done."""
        s, reply = self.session, r.thinker
        timings = reply.report["timings_ms"]
        name = s.event_name("transcript.delta" if r.audio else "text.delta")
        max_tokens = self.responder.settings.max_tokens
        if isinstance(s.config.max_output_tokens, int):
            max_tokens = min(max_tokens, s.config.max_output_tokens)
        request_id = r.request_id + "-think"
        state = reply.report["thinker"] = {"request_id": request_id, "deltas": 0, "state": "running",
                                           "max_tokens": max_tokens}
        try:
            async with aclosing(self.thinker.stream(messages, request_id, max_tokens,
                                                    lambda reason: setattr(reply, "finish_reason", reason))) as deltas:
                async for delta in deltas:
                    if not spoken:
                        timings["thinker_first_token"] = _ms(t0)
                    spoken.append(delta)
                    state["deltas"] += 1
                    if feed:
                        s.engine.feed_text(r.request_id, delta)
                    if not r.word_timestamps:  # else the transcript goes word by word as it is spoken
                        await s.send(name, **ids, delta=delta)
            timings["thinker_done"] = _ms(t0)
            state["state"] = "finished"
        except asyncio.CancelledError:
            state["state"] = "aborted"
            timings["thinker_aborted"] = _ms(t0)
            raise
        except Exception as error:  # a StageError, or whatever the LLM engine raised (a prompt too long, ...)
            if not isinstance(error, StageError):
                log.exception("thinker failed")
                error = StageError(f"The thinker failed: {error}", "thinker_failed")
            state["state"] = "failed"
            reply.error = error
            if feed:
                s.engine.cancel(r.request_id, EngineError(error.message, error.code))
            return
        if feed:
            s.engine.end_input(r.request_id)

    async def _start(self, r: Response) -> tuple[float, list[dict], int]:
        """(start time, the thinker's messages, their tokens)."""
        t0 = time.perf_counter()
        r.thinker.report["timings_ms"] = {}
        messages = await self._messages(r)
        r.thinker.report["timings_ms"]["inputs_ready"] = _ms(t0)
        return t0, messages, sum(self.thinker.count_tokens(m["content"]) for m in messages)

    async def speak(self, r: Response, ids: dict) -> Outcome:
        """A thinker response with audio."""
        s = self.session
        t0, messages, n_in = await self._start(r)
        if not messages:
            return nothing_to_answer()
        timings = r.thinker.report["timings_ms"]
        stats = SpeechStats(s.metrics, "realtime")
        spoken: list[str] = []
        by_word = WordDeltas(s, ids, lambda: "".join(spoken)) if r.word_timestamps else None
        deltas = 0
        if r.cancel_reason is not None:
            stats.end("cancelled", r.output_format.rate)
            status, details = "cancelled", cancelled(r.cancel_reason)
        else:
            async def first_audio() -> None:
                timings["first_audio"] = _ms(t0)

            request = SpeechRequest(request_id=r.request_id, text="", text_complete=False, voice=r.voice,
                                    speed=r.speed, sample_rate=r.output_format.rate,
                                    word_timestamps=r.word_timestamps)
            async with AudioOut(s.engine, request, stats) as out:  # open: feed_text reaches the request
                pump = asyncio.create_task(self._pump(r, messages, ids, spoken, t0, feed=True))
                try:
                    deltas = await send_audio(s, r, ids, out, first_audio, by_word.send if by_word else None)
                finally:
                    await _stop_pump(pump)  # a no-op when the thinker already finished
            status, details = audio_status(r, out.result)
        status, details = _thinker_status(r, status, details)
        transcript = "".join(spoken).strip()
        if by_word is not None:  # what was spoken, word by word
            transcript = await by_word.finish(status == "completed")
            if r.in_conversation:
                by_word.remember(s.conversation, r.item_id)
        timings["done"] = _ms(t0)
        return Outcome(status, details, usage(input_text=n_in, output_text=len(spoken), output_audio=deltas),
                       transcript)

    async def write(self, r: Response, ids: dict) -> Outcome:
        """A thinker response with text only."""
        t0, messages, n_in = await self._start(r)
        if not messages:
            return nothing_to_answer()
        spoken: list[str] = []
        status = "cancelled"
        if r.cancel_reason is None:
            pump = asyncio.create_task(self._pump(r, messages, ids, spoken, t0, feed=False))
            r.thinker.task = pump
            try:
                await pump
                status = "completed" if r.cancel_reason is None else "cancelled"
            except asyncio.CancelledError:
                if not pump.cancelled():
                    raise
            finally:
                await _stop_pump(pump)
        details = cancelled(r.cancel_reason) if status == "cancelled" else None
        status, details = _thinker_status(r, status, details)
        return Outcome(status, details, usage(input_text=n_in, output_text=len(spoken)), "".join(spoken).strip())


def _thinker_status(r: Response, status: str, details: dict | None) -> tuple[str, dict | None]:
    """A thinker reply's status: failed with the thinker, incomplete when the LLM stopped at the token limit."""
    if r.thinker.error is not None:
        return "failed", failed(r.thinker.error)
    if status == "completed" and r.thinker.finish_reason == "length":
        return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
    return status, details


def _decode_input(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Input audio bytes -> float32 samples at `fmt.rate`."""
    if fmt.encoding == "pcm16":
        samples = np.frombuffer(data, dtype="<i2")
    elif fmt.encoding == "g711_ulaw":
        samples = ulaw_to_pcm16(data)
    else:
        samples = alaw_to_pcm16(data)
    return samples.astype(np.float32) / 32768.0


class AudioTurns:
    """The input audio buffer's turns: committed (by the client or by server VAD) and transcribed."""

    def __init__(self, session: SessionState, turns: TurnState, responses: Responses,
                 transcriber: Transcriber | None) -> None:
        self.session = session
        self.turns = turns
        self.responses = responses
        self.transcriber = transcriber

    async def commit(self) -> None:
        """`input_audio_buffer.commit`: the whole buffer becomes a user audio item, transcribed in the background."""
        s = self.session
        if not s.input_audio:
            raise APIError(400, "The input audio buffer is empty; append audio before committing.",
                           code="input_audio_buffer_commit_empty")
        if self.transcriber is None:
            seconds = len(s.input_audio) / s.config.input_format.bytes_per_second
            raise APIError(
                400, f"This server has no speech recogniser or thinker configured, so the {seconds:.2f} s of committed "
                "audio cannot become a user turn. Send text with conversation.item.create instead. The buffer is "
                "unchanged; input_audio_buffer.clear empties it.", code="input_audio_not_supported")
        await self._commit(s.take_input_audio(), new_id("item"))

    async def _commit(self, data: bytes, item_id: str) -> tuple[dict, asyncio.Task]:
        """`data` becomes the user audio item `item_id`; (the item, its transcription)."""
        s = self.session
        item = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}
        previous = s.conversation.insert(item)
        await s.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        await s.announce_item(item, previous)
        transcription = asyncio.create_task(self._transcribe(item, data, s.config.input_format))
        self.turns.track(item_id, transcription)
        return item, transcription

    async def clear(self) -> None:
        self.session.take_input_audio()
        self.turns.forget_speech()
        await self.session.send("input_audio_buffer.cleared")

    async def _transcribe(self, item: dict, data: bytes, fmt: AudioFormat) -> None:
        s = self.session
        ids = {"item_id": item["id"], "content_index": 0}
        pcm = await asyncio.to_thread(_decode_input, data, fmt)
        seconds = len(pcm) / fmt.rate
        transcript = ""
        language = (s.config.transcription or {}).get("language")
        prompt = (s.config.transcription or {}).get("prompt")
        request_id = new_request_id("asr")
        try:
            async with aclosing(self.transcriber.stream(pcm, fmt.rate, request_id, language, prompt)) as deltas:
                async for delta in deltas:
                    transcript += delta
                    await s.send("conversation.item.input_audio_transcription.delta", **ids, delta=delta)
        except Exception as error:  # a StageError, or vLLM's own; the session goes on
            if isinstance(error, StageError):
                code, message = error.code, error.message
            else:
                log.exception("transcription failed")
                code, message = "transcription_failed", str(error)
            await s.send("conversation.item.input_audio_transcription.failed", **ids, error={
                "type": "transcription_error", "code": code, "message": message, "param": None})
            return
        transcript = transcript.strip()
        item["content"][0]["transcript"] = transcript
        await s.send("conversation.item.input_audio_transcription.completed", **ids, transcript=transcript,
                     usage={"type": "duration", "seconds": round(seconds, 3)})

    async def on_input_audio(self, data: bytes, start_ms: float) -> None:
        """Have server VAD hear newly appended audio (it starts at `start_ms` of the session's input audio):
        speech start barges in, speech stop commits the turn. The VAD runs off the event loop; its events are
        handled in order as it hears them."""
        s, turns = self.session, self.turns
        config = s.config.turn_detection
        if config is None:
            turns.vad = None
            return
        settings = VadSettings.from_turn_detection(config)  # checked by session.update
        fmt = s.config.input_format
        turns.listen(turns.vad_for(settings, fmt.rate, round(start_ms)), _decode_input(data, fmt), self._on_vad_event)

    async def _on_vad_event(self, event: VadEvent) -> None:
        config = self.session.config.turn_detection
        if config is None:  # turned off since the audio was appended
            return
        settings = VadSettings.from_turn_detection(config)
        try:
            if event.kind == "speech_started":
                await self._speech_started(event.ms, settings)
            else:
                await self._speech_stopped(event.ms, settings)
        except APIError as error:  # e.g. the conversation is full: the client hears why, the VAD goes on
            await self.session.send_error(error, None)

    async def _speech_started(self, audio_start_ms: int, settings: VadSettings) -> None:
        s, turns = self.session, self.turns
        turns.speech_item_id, turns.speech_start_ms = new_id("item"), audio_start_ms
        heard_at = time.monotonic()
        if settings.interrupt_response:  # barge-in: stop generating before anything else
            turns.drop_pending_reply()
            self.responses.cancel("turn_detected")
        await s.send("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms,
                     item_id=turns.speech_item_id)
        if settings.interrupt_response:
            await self._interrupt(heard_at)

    async def _interrupt(self, heard_at: float) -> None:
        """The user spoke over the newest response: it stops if it is still running (the thinker and the talker
        stop), and its reply is cut at what the user can have heard by `heard_at`. Audio is made faster than
        real time, so a reply whose generation ended long ago may still be playing: it is cut too, as upstream's
        server does with the output audio buffer it plays (docs/realtime.md). A reply played to its end is left
        alone, and so is one cut already (the client stopped playing it then)."""
        s, response = self.session, self.responses.latest
        if response is None:
            return
        played_ms = response.played_ms(heard_at)
        running = self.responses.current is response
        if running:
            await self.responses.stop("turn_detected")
        if not response.in_conversation or not response.audio or response.cut_ms is not None \
                or (not running and played_ms >= response.audio_ms):
            return
        response.cut_ms = played_ms
        index = s.conversation.index(response.item_id)
        content = s.conversation.items[index].get("content") if index is not None else None
        if not content:  # the client deleted the item, or the response ended before its content
            return
        # Upstream keeps no text the user has not heard (a thinker's text runs ahead of its audio); a reply spoken
        # with word timings keeps the words heard. The audio length the client may truncate to stays: its own
        # conversation.item.truncate (it knows what it played) still applies.
        content[0]["transcript"] = heard_transcript(s.conversation, response.item_id, content[0].get("transcript")
                                                    or "", played_ms, response.audio_ms)
        await s.send("conversation.item.truncated", item_id=response.item_id, content_index=0,
                     audio_end_ms=played_ms)

    async def _speech_stopped(self, audio_end_ms: int, settings: VadSettings) -> None:
        s, turns = self.session, self.turns
        item_id, start_ms = turns.speech_item_id or new_id("item"), turns.speech_start_ms
        turns.speech_item_id = turns.speech_start_ms = None
        await s.send("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=item_id)
        if self.transcriber is None:
            return  # nothing can make the audio a turn; the buffer waits for commit or clear
        data = s.take_input_audio(start_ms, audio_end_ms)
        if not data:  # the client committed or cleared the speech already
            return
        item, transcription = await self._commit(data, item_id)
        if settings.create_response:
            turns.drop_pending_reply()
            turns.pending_reply = asyncio.create_task(self._reply_when_heard(item, transcription))

    async def _reply_when_heard(self, item: dict, transcription: asyncio.Task) -> None:
        """A VAD turn's response, created once its transcript is in; none when the transcript is empty (noise
        the VAD took for speech) or the transcription failed."""
        await asyncio.wait([transcription])
        self.turns.pending_reply = None  # from here on, speech barges in on the response instead
        if not item["content"][0].get("transcript"):
            log.info("no response to item %s: its transcript is empty", item["id"])
            return
        try:
            await self.responses.create(None)
        except APIError as error:
            await self.session.send_error(error, None)

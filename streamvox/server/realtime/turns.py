"""Voice-agent turns on `/v1/realtime`: thinker responses, transcribed audio turns, server VAD and barge-in.

`openai_realtime.RealtimeSession` calls these functions when the server has a `Responder` with a thinker and/or
a transcriber; without them it keeps its echo behaviour. Kept apart from the protocol code on purpose.

A thinker response runs two things at once: the thinker's token stream, each delta fed into the talker
(`engine.feed_text`) and sent as a transcript delta as soon as it is generated, and the talker's audio, sent
as audio deltas as soon as they are decoded. So speech starts after the first clause, long before the thinker
has finished; `engine.end_input` marks the text done when the thinker finishes. Cancelling the response
(`response.cancel`, a new `response.create`, or speech starting under server VAD) cancels the talker request
and closes the thinker's stream, which aborts its LLM request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np
import pybase64

from streamvox.agent.asr import TranscriberError
from streamvox.agent.errors import StageError
from streamvox.agent.thinker import ThinkerError
from streamvox.agent.vad import EnergyVad, VadSettings
from streamvox.audio.g711 import alaw_to_pcm16, ulaw_to_pcm16
from streamvox.audio.resample import Resampler
from streamvox.contract import SpeechRequest
from streamvox.engine.events import SLOW_CONSUMER, AudioChunk, Done, EngineError
from streamvox.server.audio_out import SpeechStats
from streamvox.server.realtime.protocol import RealtimeError, event_name, item_text, new_id

if TYPE_CHECKING:
    from streamvox.server.realtime.endpoint import RealtimeSession, Response

log = logging.getLogger(__name__)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


# conversation -> chat messages


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


async def _thinker_messages(s: RealtimeSession, r: Response) -> list[dict]:
    await wait_for_transcriptions(s)
    if r.input_items is not None:
        items = []
        for i, entry in enumerate(r.input_items):
            if isinstance(entry, dict) and entry.get("type") == "item_reference":
                items.append(s.conversation.get(entry.get("id"), f"response.input[{i}].id"))
            else:
                items.append(entry)
    else:
        items = [item for item in s.conversation.items if item["id"] != r.item_id]
    return s.responder.messages(chat_history(items), r.instructions)


# thinker responses


async def _pump_thinker(s: RealtimeSession, r: Response, messages: list[dict], ids: dict, spoken: list[str],
                        t0: float, feed: bool) -> None:
    """Thinker deltas -> talker text and transcript (or text) deltas; end the talker's input when done."""
    thinker = s.responder.thinker
    timings = r.extra["timings_ms"]
    name = event_name(s.dialect, "transcript.delta" if r.audio else "text.delta")
    max_tokens = s.responder.settings.max_tokens
    if isinstance(s.config.max_output_tokens, int):
        max_tokens = min(max_tokens, s.config.max_output_tokens)
    r.extra["thinker"] = {"request_id": r.request_id + "-think", "deltas": 0, "state": "running",
                          "max_tokens": max_tokens}
    try:
        async with aclosing(thinker.stream(messages, r.request_id + "-think", max_tokens)) as deltas:
            async for delta in deltas:
                if not spoken:
                    timings["thinker_first_token"] = _ms(t0)
                spoken.append(delta)
                r.extra["thinker"]["deltas"] += 1
                if feed:
                    s.engine.feed_text(r.request_id, delta)
                await s.send(name, **ids, delta=delta)
        timings["thinker_done"] = _ms(t0)
        r.extra["thinker"]["state"] = "finished"
    except asyncio.CancelledError:
        r.extra["thinker"]["state"] = "aborted"
        timings["thinker_aborted"] = _ms(t0)
        raise
    except Exception as error:  # ThinkerError, or whatever the LLM engine raised (a prompt too long, ...)
        if not isinstance(error, ThinkerError):
            log.exception("thinker failed")
            error = ThinkerError(f"The thinker failed: {error}")
        r.extra["thinker"]["state"] = "failed"
        r.thinker_error = error
        if feed:
            s.engine.cancel(r.request_id, EngineError(error.message, error.code))
        return
    if feed:
        s.engine.end_input(r.request_id)


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


def failure_details(error: EngineError | StageError) -> dict:
    return {"type": "failed", "error": {"type": "server_error", "code": error.code, "message": error.message}}


def _usage(input_tokens: int, text_out: int, audio_out: int) -> dict:
    return {"total_tokens": input_tokens + text_out + audio_out, "input_tokens": input_tokens,
            "output_tokens": text_out + audio_out,
            "input_token_details": {"text_tokens": input_tokens, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}}


async def think_and_speak(s: RealtimeSession, r: Response, ids: dict) -> tuple[str, dict | None, dict, str]:
    """A thinker response with audio: (status, status_details, usage, transcript)."""
    t0 = time.perf_counter()
    r.extra["timings_ms"] = {}
    timings = r.extra["timings_ms"]
    messages = await _thinker_messages(s, r)
    timings["inputs_ready"] = _ms(t0)  # pending transcriptions of the turn are done
    n_in = sum(s.responder.thinker.count_tokens(m["content"]) for m in messages)
    fmt = r.output_format
    resampler = Resampler(s.info.sample_rate, fmt.rate)
    stats = SpeechStats(s.metrics, "realtime")
    delta_name = event_name(s.dialect, "audio.delta")
    spoken: list[str] = []
    chunks, audio_bytes = 0, 0
    status, details = "cancelled", None

    async def send_audio(data: bytes) -> None:
        nonlocal audio_bytes
        if data:
            if "first_audio" not in timings:
                timings["first_audio"] = _ms(t0)
            await s.send(delta_name, **ids, delta=pybase64.b64encode_as_string(data))
            audio_bytes += len(data)
            s.conversation.audio_ms[r.item_id] = audio_bytes * 1000 // fmt.bytes_per_second

    if r.cancel_reason is None:
        request = SpeechRequest(request_id=r.request_id, text="", text_complete=False, voice=r.voice,
                                speed=r.speed)
        events = s.engine.submit(request)
        first = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0)  # the submit generator registers the request before any text is fed
        pump = asyncio.create_task(_pump_thinker(s, r, messages, ids, spoken, t0, feed=True))
        try:
            event = await first
            while r.cancel_reason is None:
                match event:
                    case AudioChunk(pcm=pcm):
                        chunks += 1
                        stats.audio(len(pcm))
                        await send_audio(fmt.encode(resampler.process(pcm)))
                        if s.sender.stalled:
                            status, details = "failed", failure_details(SLOW_CONSUMER)
                            break
                        await asyncio.sleep(0)  # let the reader see a cancel between deltas
                    case Done(reason="cancelled"):
                        break
                    case Done() as done:
                        await send_audio(fmt.encode(resampler.flush()))
                        status = "completed" if done.reason == "stop" else "incomplete"
                        if status == "incomplete":
                            details = {"type": "incomplete", "reason": "max_output_tokens"}
                        break
                    case EngineError() as error:
                        status, details = "failed", failure_details(error)
                        break
                event = await events.__anext__()
        except StopAsyncIteration:
            pass
        finally:
            if not first.done():
                first.cancel()
            await _stop_pump(pump)  # a no-op when the thinker already finished
            await events.aclose()
    if r.thinker_error is not None:
        status, details = "failed", failure_details(r.thinker_error)
    if status == "cancelled":
        details = {"type": "cancelled", "reason": r.cancel_reason or "client_cancelled"}
    timings["done"] = _ms(t0)
    stats.end("ok" if status == "completed" else status, s.info.sample_rate)
    return status, details, _usage(n_in, len(spoken), chunks), "".join(spoken).strip()


async def think_text(s: RealtimeSession, r: Response, ids: dict) -> tuple[str, dict | None, dict, str]:
    """A thinker response with text only."""
    t0 = time.perf_counter()
    r.extra["timings_ms"] = {}
    messages = await _thinker_messages(s, r)
    r.extra["timings_ms"]["inputs_ready"] = _ms(t0)
    n_in = sum(s.responder.thinker.count_tokens(m["content"]) for m in messages)
    spoken: list[str] = []
    status, details = "cancelled", None
    if r.cancel_reason is None:
        pump = asyncio.create_task(_pump_thinker(s, r, messages, ids, spoken, t0, feed=False))
        r.thinker_task = pump
        try:
            await pump
            status = "completed" if r.cancel_reason is None else "cancelled"
        except asyncio.CancelledError:
            if not pump.cancelled():
                raise
        finally:
            await _stop_pump(pump)
    if r.thinker_error is not None:
        status, details = "failed", failure_details(r.thinker_error)
    if status == "cancelled":
        details = {"type": "cancelled", "reason": r.cancel_reason or "client_cancelled"}
    s.metrics.requests.labels("realtime", status).inc()
    return status, details, _usage(n_in, len(spoken), 0), "".join(spoken).strip()


# audio turns


def _decode_input(s: RealtimeSession, data: bytes) -> tuple[np.ndarray, int]:
    fmt = s.config.input_format
    if fmt.encoding == "pcm16":
        samples = np.frombuffer(data, dtype="<i2")
    elif fmt.encoding == "g711_ulaw":
        samples = ulaw_to_pcm16(data)
    else:
        samples = alaw_to_pcm16(data)
    return samples.astype(np.float32) / 32768.0, fmt.rate


async def commit_audio(s: RealtimeSession, item_id: str | None = None) -> None:
    """Make the input buffer a user audio item and transcribe it in the background."""
    if not s.input_audio:
        raise RealtimeError("The input audio buffer is empty; append audio before committing.",
                            code="input_audio_buffer_commit_empty")
    data, s.input_audio = bytes(s.input_audio), bytearray()
    if s.vad is not None:
        s.vad.reset()
    item_id = item_id or new_id("item")
    item = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
            "content": [{"type": "input_audio", "transcript": None}]}
    previous = s.conversation.insert(item)
    await s.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
    await s._announce_item(item, previous)
    task = asyncio.create_task(_transcribe(s, item, data))
    s.transcriptions[item_id] = task
    task.add_done_callback(lambda _: s.transcriptions.pop(item_id, None))


async def _transcribe(s: RealtimeSession, item: dict, data: bytes) -> None:
    ids = {"item_id": item["id"], "content_index": 0}
    pcm, rate = await asyncio.to_thread(_decode_input, s, data)
    seconds = len(pcm) / rate
    transcript = ""
    language = (s.config.transcription or {}).get("language")
    prompt = (s.config.transcription or {}).get("prompt")
    try:
        async with aclosing(s.responder.transcriber.stream(pcm, rate, new_id("asr"), language, prompt)) as deltas:
            async for delta in deltas:
                transcript += delta
                await s.send("conversation.item.input_audio_transcription.delta", **ids, delta=delta)
    except TranscriberError as error:
        await s.send("conversation.item.input_audio_transcription.failed", **ids, error={
            "type": "transcription_error", "code": error.code, "message": error.message, "param": None})
        return
    except Exception as error:  # vLLM raises its own errors; the session goes on
        log.exception("transcription failed")
        await s.send("conversation.item.input_audio_transcription.failed", **ids, error={
            "type": "transcription_error", "code": "transcription_failed", "message": str(error), "param": None})
        return
    transcript = transcript.strip()
    item["content"][0]["transcript"] = transcript
    await s.send("conversation.item.input_audio_transcription.completed", **ids, transcript=transcript,
                 usage={"type": "duration", "seconds": round(seconds, 3)})


async def wait_for_transcriptions(s: RealtimeSession) -> None:
    if s.transcriptions:
        await asyncio.gather(*list(s.transcriptions.values()), return_exceptions=True)


def close(s: RealtimeSession) -> None:
    for task in list(s.transcriptions.values()):
        task.cancel()


# server VAD


def _turn_detection(s: RealtimeSession) -> dict | None:
    config = s.config.turn_detection
    if isinstance(config, dict) and config.get("type") in ("server_vad", "semantic_vad"):
        return config
    return None


async def on_input_audio(s: RealtimeSession, data: bytes) -> None:
    """Run server VAD over newly appended audio: speech start barges in, speech stop commits the turn."""
    config = _turn_detection(s)
    if config is None:
        s.vad = None
        return
    if s.config.input_format.encoding != "pcm16":
        return
    try:
        settings = VadSettings.from_turn_detection(config)
    except ValueError as exc:
        raise RealtimeError(f"turn_detection: {exc}.", param="session.audio.input.turn_detection") from exc
    if s.vad is None or s.vad.settings != settings or s.vad_rate != s.config.input_format.rate:
        s.vad, s.vad_rate = EnergyVad(settings, s.config.input_format.rate), s.config.input_format.rate
    for event in s.vad.process(data):
        if event.kind == "speech_started":
            s.vad_item_id = new_id("item")
            await s.send("input_audio_buffer.speech_started", audio_start_ms=event.ms, item_id=s.vad_item_id)
            if settings.interrupt_response and s.response is not None:
                await s._stop_response("turn_detected")  # barge-in: the thinker and the talker stop
        else:
            item_id = s.vad_item_id or new_id("item")
            s.vad_item_id = None
            await s.send("input_audio_buffer.speech_stopped", audio_end_ms=event.ms, item_id=item_id)
            if s.responder is None or s.responder.transcriber is None:
                continue  # nothing can make the audio a turn; the buffer waits for commit or clear
            await commit_audio(s, item_id)
            if settings.create_response:
                await s.response_create({"type": "response.create"})
            return  # the rest of this append was committed with the turn


def describe(s: RealtimeSession, session: dict) -> dict:
    if s.responder is not None:
        session.setdefault("streamvox", {}).update(s.responder.describe())
    return session

"""Word timings through the engine core and front end: after the audio they cover, before the end."""

from __future__ import annotations

import asyncio
import re
from contextlib import aclosing

from streamvox.contract import SpeechRequest, WordTimings
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.engine.events import AudioChunk, Done, EngineError, Words

TEXT = "Word timings follow the audio, one clause at a time. Then the request ends; every word is timed."


async def _events(engine: AsyncEngine, request: SpeechRequest) -> list:
    async with aclosing(engine.submit(request)) as events:
        return [event async for event in events]


def _check_order(events: list, rate: int) -> WordTimings:
    """Every `Words` comes after the audio through its last word's end, and before `Done`; -> all timings."""
    samples, parts = 0, []
    for event in events[:-1]:
        if isinstance(event, AudioChunk):
            samples += len(event.pcm)
        else:
            assert isinstance(event, Words)
            assert event.timings.end[-1] <= samples / rate + 1e-6, "timings overtook their audio"
            parts.append(event.timings)
    assert isinstance(events[-1], Done) and events[-1].reason == "stop"
    return WordTimings.join(parts)


def test_timings_follow_their_audio_at_any_output_rate_and_only_when_asked(engine_run):
    async def body(engine: AsyncEngine):
        native = engine.info.sample_rate
        assert engine.info.word_timestamps
        runs = {}
        for rate in (native, 16000, 48000):
            request = SpeechRequest(request_id=new_request_id(), text=TEXT, sample_rate=rate, word_timestamps=True)
            runs[rate] = _check_order(await _events(engine, request), rate)
        words = [m.group() for m in re.finditer(r"\S+", TEXT)]
        for timings in runs.values():
            assert timings.words == words
            assert [TEXT[a:b] for a, b in zip(timings.char_start, timings.char_end, strict=True)] == words
        # seconds: the output rate does not change them (resampling only delays the audio a little)
        assert runs[16000] == runs[native] == runs[48000]
        plain = await _events(engine, SpeechRequest(request_id=new_request_id(), text=TEXT))
        assert not any(isinstance(event, Words) for event in plain)

    engine_run(body)


def test_streamed_text_is_timed_against_the_whole_input(engine_run):
    async def body(engine: AsyncEngine):
        whole = _check_order(await _events(engine, SpeechRequest(
            request_id=new_request_id(), text=TEXT, word_timestamps=True)), engine.info.sample_rate)
        request_id = new_request_id()
        task = asyncio.create_task(_events(engine, SpeechRequest(
            request_id=request_id, text="", text_complete=False, word_timestamps=True)))
        await asyncio.sleep(0)
        for piece in re.findall(r"\S+\s*", TEXT):  # token by token, split inside words too
            for part in (piece[:2], piece[2:]):
                engine.feed_text(request_id, part)
            await asyncio.sleep(0.005)
        engine.end_input(request_id)
        streamed = _check_order(await task, engine.info.sample_rate)
        assert streamed == whole

    engine_run(body)


def test_a_cancelled_request_gets_no_more_timings(engine_run):
    async def body(engine: AsyncEngine):
        request = SpeechRequest(request_id=new_request_id(), text=TEXT * 4, word_timestamps=True)
        events = []
        async with aclosing(engine.submit(request)) as stream:
            async for event in stream:
                events.append(event)
                if isinstance(event, AudioChunk):
                    engine.cancel(request.request_id)
        assert isinstance(events[-1], Done) and events[-1].reason == "cancelled"
        # the engine keeps serving timings to the next request
        again = await _events(engine, SpeechRequest(request_id=new_request_id(), text="Still here.",
                                                    word_timestamps=True))
        assert _check_order(again, engine.info.sample_rate).words == ["Still", "here."]
        assert not any(isinstance(event, EngineError) for event in again)

    engine_run(body)

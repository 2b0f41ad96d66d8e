"""The engine front end and core process, driven directly (no HTTP)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import numpy as np

from streamvox.contract import SpeechRequest
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.engine.events import AudioChunk, Done, EngineError

TEXT = "Streaming text arrives word by word, like tokens from a language model. Then it ends."


async def _collect(events) -> tuple[np.ndarray, object, float | None]:
    """All audio, the final event, and when the first audio arrived (loop time)."""
    parts, last, first_at = [], None, None
    async with aclosing(events) as stream:
        async for event in stream:
            if isinstance(event, AudioChunk):
                parts.append(event.pcm)
                first_at = first_at or asyncio.get_running_loop().time()
            else:
                last = event
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), last, first_at


def test_streaming_text_equals_whole_text_and_speaks_before_input_ends(engine_run):
    async def body(engine: AsyncEngine):
        whole, done, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text=TEXT)))
        assert isinstance(done, Done) and done.reason == "stop"

        request_id = new_request_id()
        events = engine.submit(SpeechRequest(request_id=request_id, text="", text_complete=False))
        collector = asyncio.create_task(_collect(events))
        words = TEXT.split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(0.02)
            engine.feed_text(request_id, word + (" " if i < len(words) - 1 else ""))
        await asyncio.sleep(0.3)
        input_ended_at = asyncio.get_running_loop().time()
        engine.end_input(request_id)
        streamed, done, first_at = await collector
        assert isinstance(done, Done)
        return whole, streamed, first_at is not None and first_at < input_ended_at

    whole, streamed, early = engine_run(body)
    assert early, "no audio before the input ended"
    assert len(whole) == len(streamed), (len(whole), len(streamed))
    assert np.array_equal(whole, streamed)


def test_unknown_voice_is_a_request_error_and_engine_keeps_serving(engine_run):
    async def body(engine: AsyncEngine):
        _, error, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text="hi", voice="zz")))
        audio, done, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text="Still here.")))
        return error, audio, done

    error, audio, done = engine_run(body)
    assert isinstance(error, EngineError) and error.is_request_error and error.param == "voice"
    assert isinstance(done, Done) and len(audio) > 1000


def test_cancel_stops_a_request_and_frees_it(engine_run):
    async def body(engine: AsyncEngine):
        request_id = new_request_id()
        events = engine.submit(SpeechRequest(request_id=request_id, text="Keep talking. " * 200))
        first = await anext(events)
        engine.cancel(request_id)
        rest = [event async for event in events]
        return first, rest, engine.active_requests

    first, rest, active = engine_run(body)
    assert isinstance(first, AudioChunk)
    assert isinstance(rest[-1], Done) and rest[-1].reason == "cancelled"
    assert active == 0


def test_engine_resamples_to_the_requested_rate_as_the_front_end_would(engine_run):
    """`SpeechRequest.sample_rate`: the core resamples (off the event loop); same samples as resampling the
    model-rate audio in one stream, and an invalid rate is a request error."""
    from streamvox.audio.resample import Resampler

    async def body(engine: AsyncEngine):
        native, done, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text=TEXT)))
        assert isinstance(done, Done)
        resampled, done, _ = await _collect(
            engine.submit(SpeechRequest(request_id=new_request_id(), text=TEXT, sample_rate=24000)))
        assert isinstance(done, Done)
        _, error, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text="hi",
                                                                 sample_rate=5)))
        return engine.info.sample_rate, native, resampled, error

    rate, native, resampled, error = engine_run(body)
    assert rate != 24000
    resampler = Resampler(rate, 24000)
    expected = np.concatenate([resampler.process(native), resampler.flush()])
    assert len(resampled) == len(expected)
    np.testing.assert_allclose(resampled, expected, atol=1e-6)
    assert isinstance(error, EngineError) and error.is_request_error and error.param == "sample_rate"


def test_engine_time_stretches_speed_before_resampling(engine_run):
    """`SpeechRequest.speed` on a model without native speed: the core time-stretches the model-rate audio (the
    model speaks at its own rate), then resamples; streamed text gives the same audio; a bad speed is refused."""
    from streamvox.audio.resample import Resampler
    from streamvox.audio.time_stretch import TimeStretcher

    async def body(engine: AsyncEngine):
        assert not engine.info.native_speed
        native, _, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text=TEXT)))
        fast, done, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text=TEXT, speed=2.0,
                                                                   sample_rate=24000)))
        assert isinstance(done, Done)
        request_id = new_request_id()
        events = engine.submit(SpeechRequest(request_id=request_id, text="", text_complete=False, speed=2.0,
                                             sample_rate=24000))
        collector = asyncio.create_task(_collect(events))
        words = TEXT.split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(0.02)
            engine.feed_text(request_id, word + (" " if i < len(words) - 1 else ""))
        engine.end_input(request_id)
        streamed, _, _ = await collector
        _, error, _ = await _collect(engine.submit(SpeechRequest(request_id=new_request_id(), text="hi", speed=9.0)))
        return engine.info.sample_rate, native, fast, streamed, error

    rate, native, fast, streamed, error = engine_run(body)
    stretcher, resampler = TimeStretcher(rate, 2.0), Resampler(rate, 24000)
    stretched = np.concatenate([stretcher.process(native), stretcher.flush()])
    assert len(stretched) == round(len(native) / 2.0)
    expected = np.concatenate([resampler.process(stretched), resampler.flush()])
    assert len(fast) == len(expected)
    np.testing.assert_allclose(fast, expected, atol=1e-6)
    np.testing.assert_array_equal(streamed, fast)
    assert isinstance(error, EngineError) and error.is_request_error and error.param == "speed"

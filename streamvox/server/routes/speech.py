"""`POST /v1/audio/speech` (file, chunked audio, SSE) and `POST /v1/audio/speech/batch`.

Every format streams, as OpenAI's endpoint does: `stream_format=audio` sends the format's bytes as they are
encoded (chunked), `sse` sends them base64 in `speech.audio.delta` events, and a request without
`stream_format` streams its body too, except flac files (`WHOLE_FILE_FORMATS`). Each response has
its own `StreamEncoder`; the FFmpeg formats encode in a worker thread, one delta after another.
With `word_timestamps`, SSE streams carry `speech.audio.timestamps` events after the audio they cover (for
mp3/opus/aac, whose encoders hold back a frame, after the last audio), and a whole response is JSON: the
encoded audio in base64 with the word timings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
import numpy as np
import pybase64
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from streamvox.audio.formats import CONTENT_TYPES, StreamEncoder, encode_audio, encoded_sample_rate
from streamvox.contract import SpeechRequest, WordTimings
from streamvox.engine.client import AsyncEngine
from streamvox.engine.events import Done, EngineError
from streamvox.server.audio_out import AudioOut, SpeechStats
from streamvox.server.errors import APIError, internal_error
from streamvox.server.middleware import engine_request_id
from streamvox.server.speech_params import SpeechParams, parse_speech
from streamvox.settings import MediaPolicy

log = logging.getLogger(__name__)

MAX_BATCH_ITEMS = 64
MAX_BODY_BYTES = 16 * 1024 * 1024
# Without `stream_format` these are whole files that carry their length, as libsndfile writes them: a
# FLAC stream's header cannot say how long it is, and soundfile.read() of one fails. (A streamed wav's
# header says 0xFFFFFFFF, which libsndfile, PyAV and browsers read as "until the end".)
WHOLE_FILE_FORMATS = ("flac",)


def error_from_engine(error: EngineError) -> APIError:
    if error.is_request_error:
        return APIError(400, error.message, error.param, error.code)
    return APIError(503, error.message, None, error.code)


async def read_json(request: Request) -> object:
    too_large = APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="body_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large  # refused before reading it
    parts, size = [], 0
    try:
        async for chunk in request.stream():  # stop reading at the cap: a huge chunked body never sits in memory
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_large
            parts.append(chunk)
    except ClientDisconnect:  # nobody will read the answer; 499 (nginx's "client closed request") in the metrics
        raise APIError(499, "The client closed the connection before the request was read.",
                       code="client_closed_request") from None
    body = b"".join(parts)
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise APIError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc


async def parse_body(engine: AsyncEngine, body: object, policy: MediaPolicy) -> SpeechParams:
    if engine.info is None:
        raise APIError(503, "The speech engine is starting.", code="engine_unavailable")
    request_id = engine_request_id("speech")  # ends in the request's x-request-id
    if isinstance(body, dict) and body.get("ref_audio") is not None:  # decoding audio is compute
        return await asyncio.to_thread(parse_speech, body, engine.info, request_id, policy)
    return parse_speech(body, engine.info, request_id, policy)


async def synthesize(engine: AsyncEngine, request: SpeechRequest, stats: SpeechStats) -> tuple[np.ndarray, Done]:
    """Run a request to the end; the whole clip at its output rate. The caller reports `stats`."""
    pcm, done, _ = await synthesize_timed(engine, request, stats)
    return pcm, done


async def synthesize_timed(engine: AsyncEngine, request: SpeechRequest,
                           stats: SpeechStats) -> tuple[np.ndarray, Done, WordTimings | None]:
    """`synthesize`, with the request's word timings when it asked for them."""
    async with AudioOut(engine, request, stats, report=False) as out:
        parts = [pcm async for pcm in out.deltas()]
    if out.result.error is not None:
        raise error_from_engine(out.result.error)
    if out.result.done is None:
        raise APIError(503, "The request ended without a result.", code="engine_unavailable")
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    timings = (out.result.timings() or WordTimings([], [], [], [], [])) if request.word_timestamps else None
    return pcm, out.result.done, timings


def _usage(done: Done) -> dict:
    return {"input_tokens": done.input_tokens, "output_tokens": done.output_tokens,
            "total_tokens": done.input_tokens + done.output_tokens}


async def _timed_file(engine: AsyncEngine, params: SpeechParams, stats: SpeechStats) -> dict:
    """A whole response with word timestamps, as JSON: the encoded audio in base64, and the timings."""
    pcm, done, timings = await synthesize_timed(engine, params.request, stats)
    data = await asyncio.to_thread(encode_audio, pcm, params.sample_rate, params.response_format)
    return {"audio": pybase64.b64encode_as_string(data), "format": params.response_format,
            "sample_rate": encoded_sample_rate(params.sample_rate, params.response_format), **timings.to_json(),
            "usage": _usage(done)}


# Loop time to admit one request (HTTP parsing, validation, submission), for `LoopTurns`: a few hundred
# clients connecting at once are admitted over several loop iterations, not in one long one.
_ADMISSION_COST_MS = 0.5


async def speech(request: Request) -> Response:
    app = request.app.state.streamvox
    await app.engine.turns.wait(_ADMISSION_COST_MS)
    stats = SpeechStats(app.metrics, "speech")
    try:
        params = await parse_body(app.engine, await read_json(request), app.settings.media)
        if params.mode == "file" and params.request.word_timestamps:
            body = await _timed_file(app.engine, params, stats)
            stats.end("ok", params.sample_rate)
            return JSONResponse(body)
        if params.mode == "file" and params.response_format in WHOLE_FILE_FORMATS:
            pcm, _ = await synthesize(app.engine, params.request, stats)
            rate = encoded_sample_rate(params.sample_rate, params.response_format)
            data = await asyncio.to_thread(encode_audio, pcm, params.sample_rate, params.response_format)
            stats.end("ok", params.sample_rate)
            return Response(data, media_type=CONTENT_TYPES[params.response_format],
                            headers={"x-sample-rate": str(rate)})
        return await stream_speech(app.engine, params, stats)
    except APIError as error:
        stats.end(str(error.status), 1)
        return error.response()


async def stream_speech(engine: AsyncEngine, params: SpeechParams, stats: SpeechStats) -> Response:
    """Start the request, wait for its first event (so request errors are still a 400), then stream."""
    out = AudioOut(engine, params.request, stats, report=False)
    if (error := await out.first_error()) is not None:
        await out.close()
        raise error_from_engine(error)
    encoder = StreamEncoder(params.response_format, params.sample_rate)
    body = _sse_body(out, encoder) if params.mode == "sse" else _encoded(out, encoder)
    media_type = "text/event-stream" if params.mode == "sse" else CONTENT_TYPES[params.response_format]
    headers = {"x-sample-rate": str(encoder.sample_rate), "cache-control": "no-cache"}
    return StreamingResponse(body, media_type=media_type, headers=headers)


async def _encoded(out: AudioOut, encoder: StreamEncoder) -> AsyncIterator[bytes | WordTimings]:
    """The request's audio as the encoder's stream, with its word timings if it asked for them; then
    `out.result` says how it ended (and the metrics know).

    A stream that ended (even failed) is finished, so what was sent decodes to the end; a cancelled one is not.
    A failure after the headers were sent can only end the body early. Timings follow the bytes of the audio
    they cover: an FFmpeg encoder holds back part of a frame, so there they wait for the stream's end.
    """
    async def run(step, *args) -> bytes:
        return await asyncio.to_thread(step, *args) if encoder.costly else step(*args)

    held: list[WordTimings] = []
    try:
        async with aclosing(out.stream() if out.request.word_timestamps else out.deltas()) as deltas:
            async for pcm in deltas:
                if isinstance(pcm, WordTimings):
                    if encoder.costly:
                        held.append(pcm)
                    else:
                        yield pcm
                elif data := await run(encoder.encode, pcm):
                    yield data
        if out.result.status != "cancelled" and (data := await run(encoder.finish)):
            yield data
        for timings in held:
            yield timings
    finally:
        await out.close()
        out.stats.end(out.result.metrics_status, out.sample_rate)


def _sse(payload: dict) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def _sse_audio_delta(data: bytes) -> bytes:
    """`_sse({"type": "speech.audio.delta", "audio": base64})`, byte for byte, without a JSON pass over the audio."""
    return b'data: {"type":"speech.audio.delta","audio":"' + pybase64.b64encode(data) + b'"}\n\n'


async def _sse_body(out: AudioOut, encoder: StreamEncoder) -> AsyncIterator[bytes]:
    try:
        async with aclosing(_encoded(out, encoder)) as deltas:
            async for data in deltas:
                if isinstance(data, WordTimings):
                    yield _sse({"type": "speech.audio.timestamps", **data.to_json()})
                else:
                    yield _sse_audio_delta(data)
    except Exception:  # a bug (in encoding, say): the stream still ends as the protocol says, with an error
        log.exception("request %s: its stream failed", out.request.request_id)
        yield _sse({"type": "error", **internal_error().body()})
        return
    if (done := out.result.done) is not None:
        yield _sse({"type": "speech.audio.done", "usage": _usage(done)})
    elif (error := out.result.error) is not None:
        body = {"message": error.message, "type": "server_error", "param": error.param, "code": error.code}
        yield _sse({"type": "error", "error": body})


async def speech_batch(request: Request) -> Response:
    """Run every item concurrently; each gets its own result or error."""
    app = request.app.state.streamvox
    try:
        body = await read_json(request)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise APIError(400, "'items' must be a non-empty list of speech requests.", "items")
        if len(items) > MAX_BATCH_ITEMS:
            raise APIError(400, f"'items' holds more than {MAX_BATCH_ITEMS} requests.", "items")
    except APIError as error:
        return error.response()

    async def run_item(index: int, item: object) -> dict:
        stats = SpeechStats(app.metrics, "speech_batch")
        try:
            params = await parse_body(app.engine, item, app.settings.media)
            if params.mode != "file":
                raise APIError(400, "Batch items cannot stream.", "stream_format")
            pcm, done, timings = await synthesize_timed(app.engine, params.request, stats)
            data = await asyncio.to_thread(encode_audio, pcm, params.sample_rate, params.response_format)
            stats.end("ok", params.sample_rate)
            return {"index": index, "status": "succeeded", "response_format": params.response_format,
                    "sample_rate": encoded_sample_rate(params.sample_rate, params.response_format),
                    "audio": pybase64.b64encode_as_string(data), **(timings.to_json() if timings else {}),
                    "usage": _usage(done)}
        except Exception as error:  # a bug fails its item, not the items beside it
            if not isinstance(error, APIError):
                log.exception("batch item %d failed", index)
                error = internal_error()
            stats.end(str(error.status), 1)
            return {"index": index, "status": "failed", **error.body()}

    results = await asyncio.gather(*(run_item(i, item) for i, item in enumerate(items)))
    return JSONResponse({"object": "list", "data": list(results)})

"""`POST /tts/bytes`: Cartesia's one-shot synthesis; the body is the audio, streamed as it is made."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from streamvox.server.audio_out import AudioOut, SpeechStats
from streamvox.server.cartesia.params import CartesiaSettings, parse_settings
from streamvox.server.cartesia.websocket import MAX_CONTEXT_CHARS
from streamvox.server.errors import APIError
from streamvox.server.middleware import engine_request_id
from streamvox.server.routes.speech import error_from_engine, read_json

_ADMISSION_COST_MS = 0.5  # loop time to admit one request (see routes/speech.py)


async def tts_bytes(request: Request) -> Response:
    app = request.app.state.streamvox
    await app.engine.turns.wait(_ADMISSION_COST_MS)
    stats = SpeechStats(app.metrics, "cartesia_bytes")
    try:
        if app.engine.info is None:
            raise APIError(503, "The speech engine is starting.", code="engine_unavailable")
        body = await read_json(request)
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object.")
        settings = parse_settings(body, app.engine.info, websocket=False)
        transcript = body.get("transcript")
        if not isinstance(transcript, str) or not transcript.strip():
            raise APIError(400, "'transcript' is required and must be a non-empty string.", "transcript")
        if len(transcript) > MAX_CONTEXT_CHARS:
            raise APIError(400, f"'transcript' is longer than {MAX_CONTEXT_CHARS} characters.", "transcript")
        speech = msgspec.structs.replace(settings.request, request_id=engine_request_id("cartesia"), text=transcript)
        out = AudioOut(app.engine, speech, stats, report=False)
        if (error := await out.first_error()) is not None:  # refused before any audio: still a status
            await out.close()
            raise error_from_engine(error)
    except APIError as error:
        stats.end(str(error.status), 1)
        return error.response()
    headers = {"x-sample-rate": str(settings.output.sample_rate), "cache-control": "no-cache"}
    return StreamingResponse(_body(out, settings), media_type=settings.output.media_type, headers=headers)


async def _body(out: AudioOut, settings: CartesiaSettings) -> AsyncIterator[bytes]:
    """The request's audio in the asked format; a failure after the headers can only end the body early."""
    try:
        if header := settings.output.header():
            yield header
        async with aclosing(out.deltas()) as deltas:
            async for pcm in deltas:
                if data := settings.encode(pcm):
                    yield data
    finally:
        await out.close()
        out.stats.end(out.result.metrics_status, out.sample_rate)

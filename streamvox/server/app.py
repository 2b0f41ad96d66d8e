"""The Starlette application: routes, engine lifecycle, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from streamvox.agent.responder import AgentSettings, Responder
from streamvox.engine.client import AsyncEngine
from streamvox.server.demo_page import demo_routes
from streamvox.server.housekeeping import trim_when_idle
from streamvox.server.media_fetch import MediaPolicy, OriginMiddleware
from streamvox.server.metrics import LoopLagMonitor, Metrics
from streamvox.server.middleware import APIKeyMiddleware
from streamvox.server.realtime.endpoint import realtime_endpoint
from streamvox.server.routes.speech import speech, speech_batch
from streamvox.server.routes.speech_stream import speech_stream_endpoint
from streamvox.server.routes.voices import VoiceStore, default_voices_dir, delete_voice, list_voices, upload_voice
from streamvox.server.speech_params import configure_media_policy


@dataclass
class ServerSettings:
    model: str = "espeak"
    model_options: dict = field(default_factory=dict)  # device, dtype, max_batch for `load_runner`
    api_key: str | None = None
    exit_on_engine_crash: bool = False  # True: exit non-zero for a supervisor instead of restarting
    agent: AgentSettings = field(default_factory=AgentSettings)  # thinker LLM / ASR (voice agent)
    max_buffered_audio_s: float = 300.0  # audio queued for a client that stops reading, before it is dropped
    engine_restart_backoff_max_s: float = 30.0  # longest wait between restarts of an engine that keeps failing
    media: MediaPolicy = field(default_factory=MediaPolicy)  # where `ref_audio` may be read from
    allowed_origins: tuple[str, ...] = ()  # WebSocket Origins allowed besides none and same-host ("*": any)
    voices_dir: str | None = None  # cloned voices (Base checkpoints); None: the user's data directory
    replica: str | None = None  # this server's name as a Ray Serve replica (streamvox.scale), shown by /health


@dataclass
class AppState:
    settings: ServerSettings
    engine: AsyncEngine
    metrics: Metrics = field(default_factory=Metrics)
    lag: LoopLagMonitor | None = None
    engine_exit_code: int | None = None  # set when the engine died and the server must exit
    request_exit: Callable[[], None] | None = None  # set by whoever runs the server
    responder: Responder | None = None  # thinker and ASR, when the server was started with them
    voice_store: VoiceStore | None = None
    voice_pending: set[str] = field(default_factory=set)  # names being uploaded right now


async def health(request: Request) -> Response:
    state = request.app.state.streamvox
    engine = state.engine
    replica = {"replica": state.settings.replica} if state.settings.replica else {}
    if engine.is_ready:
        return JSONResponse({"status": "ok", "model": engine.info.name, "engine_pid": engine.core_pid,
                             "engine_restarts": engine.restarts, **replica})
    body = {"status": "unavailable", "engine_restarts": engine.restarts,
            "engine_consecutive_failures": engine.consecutive_failures, **replica}
    if (restart_in := engine.restart_in_s) is not None:
        body["engine_restart_in_s"] = round(restart_in, 3)
    return JSONResponse(body, status_code=503)


async def models(request: Request) -> Response:
    info = request.app.state.streamvox.engine.info
    data = [] if info is None else [{"id": info.name, "object": "model", "owned_by": "streamvox",
                                     "family": info.family, "sample_rate": info.sample_rate,
                                     "voice_cloning": info.voice_cloning, "streaming_text": info.streaming_text}]
    return JSONResponse({"object": "list", "data": data})


async def metrics(request: Request) -> Response:
    state = request.app.state.streamvox
    state.metrics.active.set(state.engine.active_requests)
    state.metrics.engine_restarts.set(state.engine.restarts)
    if state.lag is not None:
        state.metrics.loop_lag_p99.set(state.lag.p99())
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Unknown routes (404) and methods (405) in OpenAI's error shape, like every other error."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"No route {request.url.path}.", 405: f"{request.method} is not allowed on {request.url.path}."
               }.get(exc.status_code, str(exc.detail))
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: still answer in OpenAI's shape (the traceback goes to the log)."""
    body = {"error": {"message": "Internal server error.", "type": "server_error", "param": None,
                      "code": "internal_error"}}
    return JSONResponse(body, status_code=500)


ERROR_HANDLERS = {HTTPException: _http_error, Exception: _server_error}


def build_app(settings: ServerSettings) -> Starlette:
    engine = AsyncEngine(settings.model, model_options=settings.model_options,
                         restart_on_crash=not settings.exit_on_engine_crash,
                         max_buffered_audio_s=settings.max_buffered_audio_s,
                         restart_backoff_max_s=settings.engine_restart_backoff_max_s)
    state = AppState(settings, engine)
    state.voice_store = VoiceStore(settings.voices_dir or default_voices_dir())
    engine.voice_loader = state.voice_store.load_all  # run in a thread each time a core starts
    configure_media_policy(settings.media)
    if settings.agent.enabled:
        state.responder = Responder(settings.agent)
        state.responder.register_metrics(state.metrics.registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.lag = LoopLagMonitor(state.metrics)
        state.lag.start()
        housekeeping = asyncio.create_task(trim_when_idle(
            lambda: state.engine.active_requests == 0 and state.metrics.sessions._value.get() == 0))
        if settings.exit_on_engine_crash:
            state.engine.on_core_exit = lambda code: _exit_for_supervisor(state, code)
        await state.engine.start()
        if state.responder is not None:
            await state.responder.start()
        # Startup objects (modules, the app, the model info) live for the whole run: frozen, they leave the
        # collector's view, so a full collection scans only per-request objects (the start-up heap alone took
        # ~15 ms per full collection on the 2-core benchmark machine).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            state.lag.stop()
            if state.responder is not None:
                await state.responder.shutdown()
            housekeeping.cancel()
            await state.engine.shutdown()

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/audio/voices", list_voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
        Route("/metrics", metrics),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/speech/batch", speech_batch, methods=["POST"]),
        WebSocketRoute("/v1/realtime", realtime_endpoint),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream_endpoint),
        *demo_routes(),
    ]
    # Origin first: a foreign page is refused whether or not it knows the key.
    middleware = [Middleware(OriginMiddleware, allowed_origins=settings.allowed_origins)]
    if settings.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=settings.api_key))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=ERROR_HANDLERS)
    app.state.streamvox = state
    return app


def _exit_for_supervisor(state: AppState, exitcode: int | None) -> None:
    """Stop the server; `streamvox serve` then exits non-zero so a supervisor restarts it."""
    state.engine_exit_code = exitcode if exitcode else 1
    if state.request_exit is not None:
        state.request_exit()

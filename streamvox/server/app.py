"""The Starlette application: its routes and middleware, and the engine's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp

from streamvox.agent.responder import Responder
from streamvox.engine.client import AsyncEngine
from streamvox.server.cartesia.bytes import tts_bytes
from streamvox.server.cartesia.websocket import cartesia_websocket
from streamvox.server.demo_page import demo_routes
from streamvox.server.errors import ERROR_HANDLERS
from streamvox.server.housekeeping import trim_when_idle
from streamvox.server.metrics import LoopLagMonitor, Metrics
from streamvox.server.middleware import APIKeyMiddleware, OriginMiddleware, QueryKeyMiddleware, RequestIdMiddleware
from streamvox.server.realtime.endpoint import realtime_endpoint
from streamvox.server.routes.health import health, metrics, models
from streamvox.server.routes.speech import speech, speech_batch
from streamvox.server.routes.speech_stream import speech_stream_endpoint
from streamvox.server.routes.voices import VoiceStore, default_voices_dir, delete_voice, list_voices, upload_voice
from streamvox.settings import ServerSettings


@dataclass
class AppState:
    """What every route finds at `request.app.state.streamvox`."""

    settings: ServerSettings
    engine: AsyncEngine
    metrics: Metrics = field(default_factory=Metrics)
    lag: LoopLagMonitor | None = None
    engine_started: bool = False  # `streamvox serve` starts the engine before the server (see cli.py)
    engine_exit_code: int | None = None  # set when the engine died and the server must exit
    request_exit: Callable[[], None] | None = None  # set by whoever runs the server
    responder: Responder | None = None  # thinker and ASR, when the server was started with them
    voice_store: VoiceStore | None = None
    voice_pending: set[str] = field(default_factory=set)  # names being uploaded right now


def build_app(settings: ServerSettings) -> Starlette:
    engine = AsyncEngine(settings.model, model_options=settings.model_options,
                         restart_on_crash=not settings.exit_on_engine_crash,
                         max_buffered_audio_s=settings.max_buffered_audio_s,
                         restart_backoff_max_s=settings.engine_restart_backoff_max_s)
    state = AppState(settings, engine)
    state.voice_store = VoiceStore(settings.voices_dir or default_voices_dir())
    engine.voice_loader = state.voice_store.load_all  # run in a thread each time a core starts
    if settings.agent.enabled:
        state.responder = Responder(settings.agent)
        state.responder.register_metrics(state.metrics.registry)

    def idle() -> bool:
        return state.engine.active_requests == 0 and state.metrics.open_sessions() == 0

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.lag = LoopLagMonitor(state.metrics)
        state.lag.start()
        housekeeping = asyncio.create_task(trim_when_idle(idle)) if settings.env.malloc_trim else None
        if settings.exit_on_engine_crash:
            state.engine.on_core_exit = lambda code: _exit_for_supervisor(state, code)
        if not state.engine_started:
            await state.engine.start()
            state.engine_started = True
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
            if housekeeping is not None:
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
        Route("/tts/bytes", tts_bytes, methods=["POST"]),  # Cartesia's API (docs/cartesia.md)
        WebSocketRoute("/tts/websocket", cartesia_websocket),
        *demo_routes(),
    ]
    # Origin first: a foreign page is refused whether or not it knows the key (a query's key is out of sight first).
    middleware = [Middleware(QueryKeyMiddleware),
                  Middleware(OriginMiddleware, allowed_origins=settings.allowed_origins)]
    if settings.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=settings.api_key))
    app = _Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=ERROR_HANDLERS)
    app.state.streamvox = state
    return app


class _Starlette(Starlette):
    """With `RequestIdMiddleware` outside Starlette's own error middleware, so 500s carry `x-request-id` too."""

    def build_middleware_stack(self) -> ASGIApp:
        return RequestIdMiddleware(super().build_middleware_stack())


def _exit_for_supervisor(state: AppState, exitcode: int | None) -> None:
    """Stop the server; `streamvox serve` then exits non-zero so a supervisor restarts it."""
    state.engine_exit_code = exitcode if exitcode else 1
    if state.request_exit is not None:
        state.request_exit()

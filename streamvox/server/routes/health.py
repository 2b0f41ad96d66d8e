"""`GET /health` (200 when the engine is ready, else 503), `GET /v1/models` and `GET /metrics` (Prometheus).

With `--api-key`, `/health` stays open for liveness probes: a caller without the key learns only up or down.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response


async def health(request: Request) -> Response:
    state = request.app.state.streamvox
    engine = state.engine
    # A Ray Serve replica names itself (streamvox.scale): operators and tests see which one answered.
    replica = {"replica": state.settings.replica} if state.settings.replica else {}
    if not getattr(request.state, "api_key_valid", True):  # set by APIKeyMiddleware
        return JSONResponse({"status": "ok" if engine.is_ready else "unavailable", **replica},
                            status_code=200 if engine.is_ready else 503)
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

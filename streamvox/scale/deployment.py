"""The Serve deployment: each replica builds a whole StreamVox app (front end and engine core).

The app is built inside the replica (`__serve_build_asgi_app__`), never pickled: Serve runs its
lifespan there, so the engine core starts, and is ready, before the replica takes traffic.
`application` sets Serve's knobs from the server's settings (docs/scaling.md says why each).
"""

from __future__ import annotations

import dataclasses

from ray import serve
from ray.serve import Application
from ray.serve.config import BackpressureConfig
from starlette.types import ASGIApp

from streamvox.scale.health import EngineHealth
from streamvox.scale.options import ScaleOptions
from streamvox.scale.replica_app import ReplicaMiddleware
from streamvox.scale.voice_sync import VoiceSync
from streamvox.server.app import ServerSettings, build_app

DEPLOYMENT = "StreamVox"


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class StreamVoxReplica:
    def __init__(self, settings: ServerSettings, unhealthy_after_s: float, deployed_by: str) -> None:
        self.settings = settings
        self.health = EngineHealth(unhealthy_after_s)
        self.state = None  # the app's AppState, once built
        self._deployed_by = deployed_by

    def __serve_build_asgi_app__(self) -> ASGIApp:
        name = serve.get_replica_context().replica_tag
        app = build_app(dataclasses.replace(self.settings, replica=name))
        self.state = app.state.streamvox
        return ReplicaMiddleware(app, name, VoiceSync(self.state))

    async def check_health(self) -> None:
        if self.state is not None:
            self.health.check(self.state)

    def deployed_by(self) -> str:
        """The token of the command that deployed this version (see `launch.stop`)."""
        return self._deployed_by


def application(settings: ServerSettings, options: ScaleOptions, gpus_per_replica: float,
                deployed_by: str) -> Application:
    streams = options.streams_per_replica(settings.model, settings.model_options)
    return StreamVoxReplica.options(
        num_replicas=options.replicas,
        max_ongoing_requests=streams,  # every open stream or WebSocket session holds one for its whole life
        max_queued_requests=options.queued_per_proxy(settings.model, settings.model_options),
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=1),
        graceful_shutdown_timeout_s=options.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=1.0,
        max_surge_percent=options.max_surge_percent,
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=30.0,
        ray_actor_options={"num_cpus": 1, "num_gpus": gpus_per_replica},
    ).bind(settings, options.unhealthy_after_s, deployed_by)

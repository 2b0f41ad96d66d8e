"""What `streamvox serve --replicas N` was asked for, its flags, and how many streams a replica takes.

Imports nothing heavy: the command line reads these flags whether or not Ray is installed.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

# A replica's stream capacity when --replica-max-streams and --max-batch are not given. Qwen3-TTS: the
# runner's default batch (Qwen3TTSRunner's max_batch; a test keeps the two equal), so streams past it
# wait in Serve's queue for whichever replica frees a slot first instead of in one engine. eSpeak runs
# every request in its own process, so its limit is about memory and CPU, not a batch.
QWEN3_DEFAULT_MAX_BATCH = 16
ESPEAK_STREAMS = 64


@dataclass(frozen=True)
class ScaleOptions:
    replicas: int  # --replicas
    ray_address: str | None = None  # --ray-address: join this cluster; None: start a local, loopback-only one
    host: str = "127.0.0.1"  # --host: where Serve's proxy listens
    port: int = 8000  # --port
    max_streams: int | None = None  # --replica-max-streams; None: `streams_per_replica`
    max_queued: int | None = None  # --replica-max-queued; None: one replica's worth of streams
    graceful_shutdown_timeout_s: float = 60.0  # --graceful-shutdown-timeout-s
    max_surge_percent: int = 0  # --max-surge-percent: replacements started before old replicas stop
    unhealthy_after_s: float = 60.0  # an engine down this long (restarts failing) fails the health check
    health_check_period_s: float = 5.0
    gpus_per_replica: float | None = None  # None: 1 for a Qwen3-TTS model on a cluster with GPUs, else 0
    proxy_location: str = "EveryNode"  # --proxy-location: one proxy per node, or HeadOnly (docs/scaling.md)

    def streams_per_replica(self, model: str, model_options: dict) -> int:
        """Serve's `max_ongoing_requests`: every open stream or WebSocket session holds one for its life."""
        if self.max_streams:
            return self.max_streams
        if model_options.get("max_batch"):
            return model_options["max_batch"]
        return ESPEAK_STREAMS if model == "espeak" else QWEN3_DEFAULT_MAX_BATCH

    def queued_per_proxy(self, model: str, model_options: dict) -> int:
        """Serve's `max_queued_requests`: requests a proxy holds while every replica is full."""
        return self.max_queued or self.streams_per_replica(model, model_options)


def add_scale_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replicas on Ray Serve (the 'ray' extra; docs/scaling.md)")
    group.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="serve N replicas, each a whole server with its own engine (one GPU each where the "
                            "cluster has GPUs), behind Ray Serve's proxy on --host/--port")
    group.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="with --replicas: join this Ray cluster (HEAD:6379) instead of starting a local one")
    group.add_argument("--replica-max-streams", type=int, default=None, metavar="K",
                       help="streams and WebSocket sessions one replica takes (default: --max-batch, else 16 "
                            "for Qwen3-TTS and 64 for espeak)")
    group.add_argument("--replica-max-queued", type=int, default=None, metavar="Q",
                       help="requests each proxy queues while every replica is full; past it, 503 "
                            "(default: --replica-max-streams)")
    group.add_argument("--graceful-shutdown-timeout-s", type=float, default=60.0,
                       help="how long a stopping server or replica lets its requests finish (default 60)")
    group.add_argument("--proxy-location", choices=("EveryNode", "HeadOnly"), default="EveryNode",
                       help="a Serve proxy on every machine (default; a load balancer goes in front) or on the head "
                            "only")
    group.add_argument("--max-surge-percent", type=int, default=0, metavar="P",
                       help="in a rolling update, start up to P%% more replicas so the old ones serve until their "
                            "replacements are ready (needs spare GPUs; default 0: stop one, then start one)")


def scale_options(args: argparse.Namespace) -> ScaleOptions | None:
    """The options of a `serve --replicas N` command line; None without --replicas."""
    if args.replicas is None:
        if args.ray_address:
            raise SystemExit("streamvox: --ray-address needs --replicas")
        return None
    if args.replicas < 1:
        raise SystemExit("streamvox: --replicas must be at least 1")
    if args.device not in ("auto", "cpu", "cuda"):
        raise SystemExit("streamvox: with --replicas, --device is auto, cpu or cuda: Ray gives each replica its GPU")
    if not 0 <= args.max_surge_percent <= 100:
        raise SystemExit("streamvox: --max-surge-percent is between 0 and 100")
    for flag in ("replica_max_streams", "replica_max_queued"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise SystemExit(f"streamvox: --{flag.replace('_', '-')} must be at least 1")
    return ScaleOptions(replicas=args.replicas, ray_address=args.ray_address, host=args.host, port=args.port,
                        max_streams=args.replica_max_streams, max_queued=args.replica_max_queued,
                        graceful_shutdown_timeout_s=args.graceful_shutdown_timeout_s,
                        max_surge_percent=args.max_surge_percent, proxy_location=args.proxy_location)

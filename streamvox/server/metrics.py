"""Prometheus metrics and the event-loop lag monitor."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The server's metrics, in a registry of its own (so tests can run several servers)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("streamvox_requests", "Requests by route and final status.",
                                ["route", "status"], registry=self.registry)
        self.ttfp = Histogram("streamvox_ttfp_seconds", "Time to the first audio packet.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rtf = Histogram("streamvox_rtf", "Real-time factor: wall time / audio duration.",
                             buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=self.registry)
        self.audio_seconds = Counter("streamvox_audio_seconds", "Audio produced, in seconds.",
                                     registry=self.registry)
        self.active = Gauge("streamvox_active_requests", "Requests the engine is serving now.",
                            registry=self.registry)
        self.loop_lag = Histogram("streamvox_event_loop_lag_seconds", "Event-loop scheduling lag.",
                                  buckets=_LAG_BUCKETS, registry=self.registry)
        self.loop_lag_p99 = Gauge("streamvox_event_loop_lag_p99_seconds",
                                  "p99 event-loop lag over the last 10 s of samples.", registry=self.registry)
        self.engine_restarts = Gauge("streamvox_engine_restarts", "Engine core restarts since start.",
                                     registry=self.registry)
        self.sessions = Gauge("streamvox_websocket_sessions", "Open WebSocket sessions.",
                              registry=self.registry)

    def open_sessions(self) -> int:
        """The `sessions` gauge's value, read through the collector interface."""
        return int(self.sessions.collect()[0].samples[0].value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopLagMonitor:
    """Measures how late the event loop wakes a sleeping task: the loop's responsiveness."""

    def __init__(self, metrics: Metrics, interval_s: float = 0.01, window: int = 1000) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.recent: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def p99(self) -> float:
        """Computed when read (GET /metrics sets the gauge), not on the loop every few samples."""
        return float(np.percentile(self.recent, 99)) if self.recent else 0.0

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - start - self.interval_s)
            self.recent.append(lag)
            self.metrics.loop_lag.observe(lag)

"""Where an engine step's time goes (`Qwen3Settings.timing`, env STREAMVOX_QWEN3_TIMING=1): a diagnostic for GPU
serving runs.

The runner adds host time per step phase (and of adding requests between steps), GPU spans (CUDA events around
frame steps and decoder calls, read only once they have completed, so timing never syncs) and per-request waits;
at the end of each window of steps one log line reports their means and percentiles, plus any notes (the
decoder's real and padded frames), and starts a new window. A window is `Qwen3Settings.timing_steps` (env
STREAMVOX_QWEN3_TIMING_STEPS, default 250): about 10 resolves the few steps in which a round of requests
arrives, is prefilled and gets its first audio (a 10 s request is 125 steps).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


class StepTiming:
    """Host time per engine-step phase, logged every `window` steps, with the GPU
    time of frame steps and decoder calls (CUDA events, read once they have completed), the decoder calls'
    real and padded frames, and per request the time from arrival to prefill and to its first audio. On CUDA
    the runner also warns of every host sync (`torch.cuda.set_sync_debug_mode`)."""

    def __init__(self, window: int = 250) -> None:
        self.window = window
        self.sec: dict[str, float] = {}
        self.items: dict[str, int] = {}
        self.spans: list[tuple[str, Any, Any]] = []  # (name, start event, end event) not yet read
        self.latency: dict[str, list[float]] = {"admit": [], "first_audio": []}
        self.notes: list[Callable[[], str]] = []  # more to log (the decoder's padding)
        self.steps = 0
        self.t0 = time.perf_counter()

    def add(self, name: str, sec: float, items: int = 0) -> None:
        self.sec[name] = self.sec.get(name, 0.0) + sec
        self.items[name] = self.items.get(name, 0) + items
        if name == "step":
            self.steps += 1
            if self.steps % self.window == 0:
                self._log()

    def gpu_span(self, name: str, stream: Any) -> Callable[[], None]:
        """Record a start event on `stream` now; the returned function records the end event."""
        start = torch.cuda.Event(enable_timing=True)
        start.record(stream)

        def end() -> None:
            stop = torch.cuda.Event(enable_timing=True)
            stop.record(stream)
            self.spans.append((name, start, stop))

        return end

    def _log(self) -> None:
        wall = time.perf_counter() - self.t0
        parts = ", ".join(f"{k} {v / self.steps * 1e3:.2f} ms ({self.items[k] / self.steps:.1f})"
                          for k, v in self.sec.items())
        done: dict[str, list[float]] = {}
        pending = []
        for name, start, stop in self.spans:
            if stop.query():
                done.setdefault(name, []).append(start.elapsed_time(stop))
            else:
                pending.append((name, start, stop))
        self.spans = pending
        gpu = ", ".join(f"{k} {len(v)} x {np.mean(v):.2f} ms (p90 {np.percentile(v, 90):.2f})" for k, v in done.items())
        lat = ", ".join(f"{k} p50 {np.percentile(v, 50) * 1e3:.1f} ms, p90 {np.percentile(v, 90) * 1e3:.1f} ms "
                        f"(n {len(v)})" for k, v in self.latency.items() if v)
        log.warning("qwen3 runner timing: %d steps in %.1f s wall: per step %s; GPU: %s; requests: %s; %s",
                     self.steps, wall, parts, gpu, lat, "; ".join(note() for note in self.notes))
        self.sec, self.items, self.steps, self.t0 = {}, {}, 0, time.perf_counter()
        self.latency = {k: [] for k in self.latency}


def time_gpu(timing: StepTiming | None, name: str, stream: Any) -> Callable[[], None]:
    """With `timing` on CUDA (`stream` not None): time the device work queued on `stream` from now until the
    returned function is called; otherwise a no-op."""
    if timing is None or stream is None:
        return lambda: None
    return timing.gpu_span(name, stream)

"""Streaming time stretch, pitch kept: one `TimeStretcher` per stream.

`speed` for a model that cannot change its own speaking rate: the engine core
stretches the request's audio on its way out, before resampling. Rubber Band
(through `pylibrb`) runs in its real-time mode, so audio goes in and comes out
delta by delta; its output does not depend on how the input is split, so a
request's streamed and file responses are the same audio.
"""

from __future__ import annotations

import numpy as np

# Input goes to Rubber Band in blocks of at most this many samples: it sizes its buffers for them.
_BLOCK = 4096


class TimeStretcher:
    """Plays one stream `speed` times as fast, pitch kept; in all, round(input / speed) samples come out."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        import pylibrb  # GPL Rubber Band inside: loaded only when a request changes speed

        option = pylibrb.Option
        # Real-time mode (incremental input); the R3 engine's short window is the one suited to speech, and
        # the cheapest; no threads of its own (the engine core is one thread per model).
        options = option.PROCESS_REALTIME | option.ENGINE_FINER | option.WINDOW_SHORT | option.THREADING_NEVER
        self._stretcher = pylibrb.RubberBandStretcher(sample_rate, 1, options, 1.0 / speed, 1.0)
        self._stretcher.set_max_process_size(_BLOCK)
        self.speed = speed
        self._consumed = 0
        self._produced = 0
        # Rubber Band's advice for real-time mode: lead in with `start_pad` zeros and drop its `start_delay`
        # first output samples, so the first real sample is neither smeared nor delayed.
        self._skip = self._stretcher.get_start_delay()
        self._parts: list[np.ndarray] = []  # output not yet returned
        self._feed(np.zeros(self._stretcher.get_preferred_start_pad(), np.float32))

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """The stretched audio that the input so far yields (Rubber Band holds back a few ms)."""
        self._feed(np.ascontiguousarray(pcm, dtype=np.float32))
        self._consumed += len(pcm)
        return self._take(round(self._consumed / self.speed))

    def flush(self) -> np.ndarray:
        """The rest, once the input has ended: cut or padded so the whole is round(input / speed) samples."""
        self._feed(np.zeros(0, np.float32), final=True)
        while len(out := self._retrieve()):
            self._parts.append(out)
        total = round(self._consumed / self.speed)
        tail = self._take(total)
        if self._produced < total:
            tail = np.concatenate([tail, np.zeros(total - self._produced, np.float32)])
            self._produced = total
        return tail

    def _feed(self, pcm: np.ndarray, final: bool = False) -> None:
        for start in range(0, max(len(pcm), 1), _BLOCK):
            block = pcm[start:start + _BLOCK]
            self._stretcher.process(block.reshape(1, -1), final=final and start + _BLOCK >= len(pcm))
            if len(out := self._retrieve()):
                self._parts.append(out)

    def _retrieve(self) -> np.ndarray:
        out = self._stretcher.retrieve_available()[0]
        if self._skip and len(out):
            dropped = min(self._skip, len(out))
            self._skip -= dropped
            out = out[dropped:]
        return out

    def _take(self, limit: int) -> np.ndarray:
        """What is ready, up to `limit` samples produced in all; beyond that is the stretcher's overhang."""
        out = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
        self._parts = []
        out = out[:max(limit - self._produced, 0)]
        self._produced += len(out)
        return out

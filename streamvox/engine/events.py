"""What callers of `AsyncEngine` get back: a request's events, and the errors the engine raises.

A request yields `AudioChunk`s (and, if it asked for word timestamps, `Words` after the audio they
cover), then exactly one `Done` or `EngineError`.
"""

from __future__ import annotations

import msgspec
import numpy as np

from streamvox.contract import WordTimings


class AudioChunk(msgspec.Struct):
    """New samples (mono float32 at the request's `sample_rate`, by default the model's)."""

    pcm: np.ndarray


class Words(msgspec.Struct):
    """When more of the request's words are spoken (see `WordTimings`); only after the audio they cover."""

    timings: WordTimings


class Done(msgspec.Struct):
    reason: str  # "stop" | "length" | "cancelled"
    input_tokens: int
    output_tokens: int


class EngineError(msgspec.Struct):
    message: str
    code: str
    param: str | None = None

    @property
    def is_request_error(self) -> bool:
        """True when the request itself was at fault (a 400), not the engine."""
        return self.code not in ("engine_unavailable", "slow_consumer")


EngineEvent = AudioChunk | Words | Done | EngineError

SLOW_CONSUMER = EngineError("The client read audio too slowly; the request was cancelled.", "slow_consumer")


class EngineUnavailable(RuntimeError):
    """The engine core is not running (not started yet, restarting, or stopped meanwhile)."""


class VoiceRefused(Exception):
    """The model refused a voice (e.g. its audio could not be analysed)."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param

"""The interface between the engine core and a model family.

A model family gives the engine core one `Runner`. The core owns the busy
loop: it hands the runner new requests, text and cancellations, then calls
`step()` whenever the runner has work. A runner keeps every piece of
per-request state (KV slot, pending text, sampler RNG, frame buffer, decoder
state) keyed by request id and frees it in `release()`.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import numpy as np

from streamvox.engine.request import SpeechRequest


class ModelInfo(msgspec.Struct, frozen=True):
    """What the front end needs to know about the served model, sent once at start-up."""

    name: str
    family: str
    sample_rate: int
    voices: list[str]
    default_voice: str
    languages: list[str] = []
    task_types: list[str] = []
    streaming_text: bool = False  # True: text may arrive token by token mid-generation
    native_speed: bool = False  # True: the model applies `speed` itself
    voice_cloning: bool = False  # True: POST /v1/audio/voices is offered


class RequestError(Exception):
    """A request the model cannot serve; becomes a 400 (or an `error` event) for that request only."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class OutputSink(Protocol):
    """Where a runner sends results; the core forwards each call to the front end at once."""

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        """A delta of mono float32 PCM at `ModelInfo.sample_rate` (only new samples)."""

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        """The request is complete (`reason`: "stop" or "length"); its state is already released."""

    def failed(self, request_id: str, error: RequestError) -> None:
        """The request failed; its state is already released."""


class Runner(Protocol):
    """One model family's execution inside the engine core process."""

    info: ModelInfo

    def add(self, request: SpeechRequest) -> None:
        """Admit a request; raise `RequestError` to refuse it."""

    def feed_text(self, request_id: str, text: str) -> None:
        """More input text for a request created with `text_complete=False`."""

    def end_input(self, request_id: str) -> None:
        """The request's text is complete."""

    def release(self, request_id: str) -> None:
        """Drop every piece of state the request holds (cancel); unknown ids are ignored."""

    def has_work(self) -> bool:
        """True when `step()` would make progress for at least one request."""

    def step(self, sink: OutputSink) -> None:
        """Advance the scheduled requests by one step, sending outputs to `sink`."""


class VoiceCloningRunner(Runner, Protocol):
    """A runner with `ModelInfo.voice_cloning`: named voices cloned from reference audio.

    A request whose `voice` names a registered voice is spoken in it; the runner derives
    what it needs (speaker embedding, reference codes) once, in `add_voice`.
    """

    def add_voice(self, name: str, ref_audio: bytes, sample_rate: int, ref_text: str | None = None) -> None:
        """Register (or replace) voice `name` from mono float32 PCM; raise `RequestError` to refuse it."""

    def remove_voice(self, name: str) -> None:
        """Forget voice `name`; unknown names are ignored. Admitted requests are unaffected."""

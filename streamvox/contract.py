"""What the engine and the model families agree on.

A request (`SpeechRequest`) goes in; a model family gives the engine core one
`Runner`, which reports the served model (`ModelInfo`) and sends each request's
audio (and, when asked, its `WordTimings`) to an `OutputSink`. The core owns the busy loop: it hands the runner new
requests, text and cancellations, then calls `step()` whenever the runner has
work. A runner keeps every piece of per-request state (KV slot, pending text,
sampler RNG, frame buffer, decoder state) keyed by request id and frees it in
`release()`. A request the model cannot serve raises `RequestError`.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import numpy as np


class SamplingParams(msgspec.Struct, frozen=True):
    """Sampling overrides; `None` means the model's default. `temperature=0` is greedy."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    max_new_tokens: int | None = None


class SpeechRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One utterance. With `text_complete=False` more text follows through `feed_text`."""

    request_id: str
    text: str = ""
    text_complete: bool = True
    voice: str | None = None
    language: str | None = None
    instructions: str | None = None
    task_type: str | None = None
    speed: float = 1.0
    ref_audio: bytes | None = None  # mono float32 PCM at `ref_sample_rate`
    ref_sample_rate: int | None = None
    ref_text: str | None = None
    # An x-vector given as is (Cartesia's embedding voices): `ModelInfo.speaker_embedding_size` little-endian
    # float32 values, spoken like a voice cloned from reference audio. Only where that size is > 0 (front ends
    # check it; a runner that takes them refuses a wrong size with a `RequestError`).
    speaker_embedding: bytes | None = None
    sampling: SamplingParams = SamplingParams()
    initial_codec_chunk_frames: int | None = None
    # Rate in Hz of the audio the request yields (1000-384000; else a `RequestError`); None: the model's
    # (`ModelInfo.sample_rate`). The engine core resamples every request whose rate differs from the
    # model's, with one stateful resampler per request (seamless chunk boundaries), before its audio
    # leaves the core. It is the one place output is resampled: a front end sets the rate its client
    # wants here and never resamples; runners always produce the model's rate.
    sample_rate: int | None = None
    # True: the runner also reports when each word is spoken (`OutputSink.words`); only where
    # `ModelInfo.word_timestamps` (else a `RequestError`).
    word_timestamps: bool = False


class WordTimings(msgspec.Struct, frozen=True):
    """When words of a request are spoken, as parallel arrays (one entry per word, in spoken order).

    `start`/`end`: seconds from the request's first sample (resampling leaves them as they are).
    `char_start`/`char_end`: the word's span in the request's whole input text (its initial text and every
    fed text, concatenated); each word is that span verbatim, punctuation attached.
    """

    words: list[str]
    start: list[float]
    end: list[float]
    char_start: list[int]
    char_end: list[int]

    def __len__(self) -> int:
        return len(self.words)

    def slice(self, start: int, stop: int | None = None) -> WordTimings:
        return WordTimings(self.words[start:stop], self.start[start:stop], self.end[start:stop],
                           self.char_start[start:stop], self.char_end[start:stop])

    def shifted(self, seconds: float = 0.0, chars: int = 0, time_scale: float = 1.0) -> WordTimings:
        """These words in a longer stretch of audio and text: times scaled by `time_scale`, then moved by
        `seconds`; character offsets moved by `chars`."""
        return WordTimings(self.words, [t * time_scale + seconds for t in self.start],
                           [t * time_scale + seconds for t in self.end],
                           [c + chars for c in self.char_start], [c + chars for c in self.char_end])

    @staticmethod
    def silent(spans: list[tuple[int, int]], text: str, at: float) -> WordTimings:
        """The words at `spans` (character offsets) of `text`, taking no time at `at` seconds: words nothing
        speaks (no letter or digit), timed where they stand."""
        n = len(spans)
        return WordTimings([text[a:b] for a, b in spans], [at] * n, [at] * n, [a for a, _ in spans],
                           [b for _, b in spans])

    @staticmethod
    def join(parts: list[WordTimings]) -> WordTimings:
        """Every word of `parts`, in order."""
        if len(parts) == 1:
            return parts[0]
        return WordTimings([w for p in parts for w in p.words], [t for p in parts for t in p.start],
                           [t for p in parts for t in p.end], [c for p in parts for c in p.char_start],
                           [c for p in parts for c in p.char_end])

    def to_json(self) -> dict:
        """The five parallel arrays, as the wire protocols carry them."""
        return {"words": self.words, "start": self.start, "end": self.end, "char_start": self.char_start,
                "char_end": self.char_end}


class ModelInfo(msgspec.Struct, frozen=True):
    """What the front end needs to know about the served model, sent once at start-up."""

    name: str
    family: str
    sample_rate: int
    voices: list[str]
    default_voice: str
    languages: list[str] = []
    task_types: list[str] = []
    speaker_embedding_size: int = 0  # > 0: requests may carry a `speaker_embedding` of this many values
    streaming_text: bool = False  # True: text may arrive token by token mid-generation
    native_speed: bool = False  # True: the model applies `speed` itself
    voice_cloning: bool = False  # True: POST /v1/audio/voices is offered
    word_timestamps: bool = False  # True: requests may ask for `WordTimings` (`SpeechRequest.word_timestamps`)


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
        """A delta of mono float32 PCM at `ModelInfo.sample_rate` (only new samples). The array is handed over:
        the runner does not change it afterwards."""

    def words(self, request_id: str, timings: WordTimings) -> None:
        """When more of the request's words are spoken (only for requests with `word_timestamps`).

        Sent after the audio the words cover, in spoken order, every one before `finished`; each word once.
        """

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

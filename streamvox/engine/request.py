"""A speech request as the engine sees it: what to say and how."""

from __future__ import annotations

import msgspec


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
    sampling: SamplingParams = SamplingParams()
    initial_codec_chunk_frames: int | None = None
    # Rate of the audio the request yields; None: the model's. The engine core resamples, so the event
    # loop does not (the one stateful resampler per request keeps chunk boundaries seamless).
    sample_rate: int | None = None

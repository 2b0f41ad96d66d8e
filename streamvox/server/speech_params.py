"""Validation of speech requests (`/v1/audio/speech` bodies, speech-stream `session.config`) into engine
requests, with OpenAI-shaped errors naming the offending field."""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from dataclasses import dataclass

import msgspec
import numpy as np
import soundfile

from streamvox.audio.formats import FORMATS
from streamvox.contract import ModelInfo, SamplingParams, SpeechRequest
from streamvox.server.errors import APIError
from streamvox.server.media_fetch import MAX_REF_AUDIO_BYTES, load_ref_audio_url
from streamvox.server.word_timestamps import parse_word_timestamps
from streamvox.settings import MediaPolicy

MAX_INPUT_CHARS = 4096
MAX_INSTRUCTIONS_CHARS = 4096
MAX_REF_TEXT_CHARS = 2048  # a reference clip's transcript (of at most 60 s), here and on voice uploads
MAX_REF_AUDIO_SECONDS = 60.0
MAX_DECODED_SAMPLES = int(MAX_REF_AUDIO_SECONDS * 192_000 * 2)  # 60 s of 192 kHz stereo: 92 MB as float32
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
DEFAULT_SAMPLE_RATE = 24000  # what OpenAI's pcm carries, and what its clients assume
# OpenAI's model names: clients written for OpenAI TTS reach the served model unmodified.
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# How to speak: the fields every speech request takes (the HTTP body, the speech stream's session.config).
SETTINGS_FIELDS = frozenset({
    "model", "voice", "instructions", "speed", "sample_rate", "language", "task_type", "ref_audio", "ref_text",
    "max_new_tokens", "seed", "initial_codec_chunk_frames", "temperature", "top_k", "top_p", "repetition_penalty",
    "word_timestamps",
})
_HTTP_FIELDS = SETTINGS_FIELDS | {"input", "response_format", "stream_format", "stream"}


@dataclass(frozen=True)
class SpeechParams:
    """A validated `/v1/audio/speech` body."""

    request: SpeechRequest  # with its output rate: the engine core resamples
    response_format: str
    mode: str  # "file" | "audio" | "sse"

    @property
    def sample_rate(self) -> int:
        return self.request.sample_rate


def _field(body: dict, name: str, kind: type | tuple, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if kind in (int, float) or kind == (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise APIError(400, f"'{name}' must be a number.", name)
        if isinstance(value, int) and abs(value) > 2**63:  # JSON integers are unbounded; floats are not
            raise APIError(400, f"'{name}' is out of range.", name)
        if kind is int and value != int(value):
            raise APIError(400, f"'{name}' must be an integer.", name)
        return kind(value) if kind in (int, float) else value
    if not isinstance(value, kind):
        raise APIError(400, f"'{name}' must be of type {getattr(kind, '__name__', kind)}.", name)
    return value


def _in_range(name: str, value, low, high):
    if value is not None and not low <= value <= high:
        raise APIError(400, f"'{name}' must be between {low} and {high}; got {value}.", name)
    return value


def check_model(body: dict, info: ModelInfo) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string.", "model")
    if model not in (info.name, *MODEL_ALIASES):
        raise APIError(404, f"The model '{model}' does not exist. This server serves '{info.name}'.",
                       "model", "model_not_found")


def decode_ref_audio(value: str, policy: MediaPolicy) -> tuple[np.ndarray, int]:
    """A base64 (or `data:` URI) audio file, or a URL the media policy allows -> mono float32 PCM and its rate.

    Fetching a URL blocks: callers run this in a worker thread (as they do for any `ref_audio`).
    """
    if value.startswith("data:"):
        _, _, value = value.partition(",")
        raw = _b64(value)
    elif value[:8].lower().startswith(("http://", "https://", "file:")):
        raw = load_ref_audio_url(value, policy)
    else:
        raw = _b64(value)
    return decode_audio_file(raw, "ref_audio")


def decode_audio_file(raw: bytes, param: str) -> tuple[np.ndarray, int]:
    """An audio file's bytes -> mono float32 PCM and its rate, under the reference-audio caps (a 400
    naming `param` otherwise). Blocking (decoding is compute): call it from a worker thread."""
    if len(raw) > MAX_REF_AUDIO_BYTES:
        raise APIError(400, f"'{param}' is larger than {MAX_REF_AUDIO_BYTES} bytes.", param, f"{param}_too_large")
    too_long = APIError(400, f"'{param}' is longer than {MAX_REF_AUDIO_SECONDS:.0f} s.", param)
    try:
        # Its length is checked before it is decoded, and what is decoded is capped: a small file can say hours
        # (4 h of silence is a 2 MB FLAC and 2.7 GB of float32).
        with soundfile.SoundFile(io.BytesIO(raw)) as file:
            most = int(MAX_REF_AUDIO_SECONDS * file.samplerate)  # frames
            if file.frames > most and file.seekable():  # (an unseekable file's length is unknown)
                raise too_long
            if most * file.channels > MAX_DECODED_SAMPLES:
                raise APIError(400, f"'{param}' has too many samples a second to decode ({file.samplerate} Hz, "
                                    f"{file.channels} channels).", param)
            pcm, rate = file.read(most + 1, dtype="float32", always_2d=True), file.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise APIError(400, f"'{param}' could not be decoded as audio (wav, flac or ogg).", param) from exc
    if len(pcm) == 0:
        raise APIError(400, f"'{param}' holds no audio.", param)
    if len(pcm) > most:
        raise too_long
    pcm = pcm.mean(axis=1).astype(np.float32)
    if not np.isfinite(pcm).all():
        raise APIError(400, f"'{param}' holds samples that are not finite numbers.", param)
    return pcm, int(rate)


def _named(value: object, names: list[str]) -> str | None:
    """`value` as one of `names`: the same name, else the one name that differs only in case ("English",
    "Auto", "Vivian"); None if there is none."""
    if not isinstance(value, str):
        return None
    if value in names:
        return value
    matches = [name for name in names if name.lower() == value.lower()]
    return matches[0] if len(matches) == 1 else None


def _b64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise APIError(400, "'ref_audio' is not valid base64.", "ref_audio") from exc


def task_type_name(name: str) -> str:
    """A task type in the model's spelling: vLLM-Omni's `CustomVoice`, `VoiceDesign`, `Base`, and `custom-voice`
    or `Custom Voice`, all name `custom_voice`, `voice_design`, `base`."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    return re.sub(r"[\s_-]+", "_", words).lower()


def reject_unknown(body: dict, known: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise APIError(400, f"Unrecognized request argument: '{unknown[0]}'.", unknown[0], "unknown_parameter")


def parse_speech_settings(body: dict, info: ModelInfo, policy: MediaPolicy) -> SpeechRequest:
    """The `SETTINGS_FIELDS` of `body` (after `model`, which the caller checks first), validated into a request
    template: every field but `request_id` (empty) and `text`. Blocking when `ref_audio` is set (decoding audio
    is compute, a URL is fetched): callers then run it in a worker thread."""
    voice = body.get("voice")
    if isinstance(voice, dict):  # OpenAI also accepts {"id": "..."}; one without an id is refused below
        voice = voice.get("id") or voice
    if voice is not None:
        if (named := _named(voice, info.voices)) is None:
            raise APIError(400, f"Unknown voice '{voice}'. GET /v1/audio/voices lists the voices of "
                                f"'{info.name}'.", "voice")
        voice = named
    language = _field(body, "language", str)
    if language is not None and info.languages:
        if (named := _named(language, [*info.languages, "auto"])) is None:
            raise APIError(400, f"Unsupported language '{language}' for model '{info.name}'.", "language")
        language = named
    instructions = _field(body, "instructions", str)
    if instructions is not None and len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise APIError(400, f"'instructions' is longer than {MAX_INSTRUCTIONS_CHARS} characters.",
                       "instructions")
    speed = _in_range("speed", _field(body, "speed", float, 1.0), 0.25, 4.0)  # any model: the core time-stretches
    sample_rate = _in_range("sample_rate", _field(body, "sample_rate", int, DEFAULT_SAMPLE_RATE),
                            MIN_SAMPLE_RATE, MAX_SAMPLE_RATE)
    task_type = _field(body, "task_type", str)
    if task_type is not None:
        asked, task_type = task_type, task_type_name(task_type)
        if info.task_types and task_type not in map(task_type_name, info.task_types):
            raise APIError(400, f"Model '{info.name}' does not support task_type '{asked}'; it supports "
                                f"{', '.join(info.task_types)}.", "task_type")
    ref_pcm, ref_rate = None, None
    if (ref_audio := _field(body, "ref_audio", str)) is not None:
        ref_pcm, ref_rate = decode_ref_audio(ref_audio, policy)
        if not info.voice_cloning:  # (after its source and contents are checked: those rules hold for every model)
            raise APIError(400, f"The model '{info.name}' does not support voice cloning, so it cannot speak in the "
                                "voice of 'ref_audio' (voice cloning needs a Qwen3-TTS Base checkpoint).",
                           "ref_audio", "voice_cloning_unsupported")
    ref_text = _field(body, "ref_text", str)
    if ref_text is not None and len(ref_text) > MAX_REF_TEXT_CHARS:
        raise APIError(400, f"'ref_text' is longer than {MAX_REF_TEXT_CHARS} characters.", "ref_text")
    sampling = SamplingParams(
        temperature=_in_range("temperature", _field(body, "temperature", float), 0.0, 2.0),
        top_k=_in_range("top_k", _field(body, "top_k", int), 0, 100000),
        top_p=_in_range("top_p", _field(body, "top_p", float), 0.0, 1.0),
        repetition_penalty=_in_range("repetition_penalty", _field(body, "repetition_penalty", float), 0.1, 10.0),
        seed=_in_range("seed", _field(body, "seed", int), 0, 2**63 - 1),
        max_new_tokens=_in_range("max_new_tokens", _field(body, "max_new_tokens", int), 1, 65536),
    )
    return SpeechRequest(
        request_id="",
        voice=voice,
        language=language,
        instructions=instructions,
        task_type=task_type,
        speed=speed,
        ref_audio=ref_pcm.tobytes() if ref_pcm is not None else None,
        ref_sample_rate=ref_rate,
        ref_text=ref_text,
        sampling=sampling,
        initial_codec_chunk_frames=_in_range(
            "initial_codec_chunk_frames", _field(body, "initial_codec_chunk_frames", int), 1, 100),
        sample_rate=sample_rate,
        word_timestamps=parse_word_timestamps(body, info),
    )


def parse_speech(body: object, info: ModelInfo, request_id: str, policy: MediaPolicy) -> SpeechParams:
    """Validate a `/v1/audio/speech` body; raise `APIError` (400/404) naming the offending field."""
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.")
    reject_unknown(body, _HTTP_FIELDS)
    check_model(body, info)
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise APIError(400, "'input' is required and must be a non-empty string.", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise APIError(400, f"'input' is longer than {MAX_INPUT_CHARS} characters.", "input")
    response_format = _field(body, "response_format", str, "wav")
    if response_format not in FORMATS:
        raise APIError(400, f"'response_format' must be one of {', '.join(FORMATS)}.", "response_format")
    stream_format = _field(body, "stream_format", str)
    if stream_format not in (None, "sse", "audio"):
        raise APIError(400, "'stream_format' must be 'sse' or 'audio'.", "stream_format")
    stream = _field(body, "stream", bool, False)
    mode = stream_format or ("sse" if stream else "file")  # every format streams
    template = parse_speech_settings(body, info, policy)
    if template.word_timestamps and mode == "audio":
        raise APIError(400, "Word timestamps come with stream_format 'sse' or a whole (JSON) response, not with "
                            "stream_format 'audio'.", "word_timestamps")
    return SpeechParams(msgspec.structs.replace(template, request_id=request_id, text=text), response_format, mode)

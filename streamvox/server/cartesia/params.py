"""Cartesia's request fields (a `/tts/websocket` context's first message, a `/tts/bytes` body) -> how to speak.

`model_id` is the served model's name or any Cartesia model name (`sonic*`): the server serves one model.
`voice` is `{"mode": "id", "id": NAME}` with a StreamVox voice (a null id: the model's default), or
`{"mode": "embedding", "embedding": [...]}` where the model takes speaker embeddings (Qwen3-TTS Base: an
x-vector of `ModelInfo.speaker_embedding_size` values). `language` takes Cartesia's codes ("en", "en-US")
as well as the model's own names. `generation_config` takes `speed` (0.25-4.0) and `volume` (0-4, a gain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamvox.audio.formats import streaming_wav_header, to_pcm16
from streamvox.audio.g711 import pcm16_to_alaw, pcm16_to_ulaw
from streamvox.contract import ModelInfo, SpeechRequest
from streamvox.server.errors import APIError

# The fields each route takes (an unknown one is a 400); LiveKit and Pipecat send these.
_SETTINGS_FIELDS = frozenset({"model_id", "voice", "output_format", "language", "generation_config",
                              "pronunciation_dict_id"})
WEBSOCKET_FIELDS = _SETTINGS_FIELDS | {"context_id", "transcript", "continue", "cancel", "add_timestamps",
                                       "add_phoneme_timestamps", "use_normalized_timestamps", "max_buffer_delay_ms"}
BYTES_FIELDS = _SETTINGS_FIELDS | {"transcript"}
ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
DEFAULT_SAMPLE_RATE = 24000
# ISO 639-1 codes -> the language names Qwen3-TTS uses (a model with the code itself, as eSpeak, keeps it).
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean", "de": "german",
                  "fr": "french", "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}
ESPEAK_NAMES = {"zh": "cmn"}  # codes whose eSpeak voice has another name (Mandarin)


@dataclass(frozen=True)
class OutputFormat:
    """`output_format`: how a context's audio is written (`container` "raw", or "wav" on `/tts/bytes`)."""

    container: str = "raw"
    encoding: str = "pcm_s16le"
    sample_rate: int = DEFAULT_SAMPLE_RATE

    @property
    def media_type(self) -> str:
        return "audio/wav" if self.container == "wav" else "application/octet-stream"

    def header(self) -> bytes:
        """What precedes the audio: a wav header for a stream of unknown length, else nothing."""
        return streaming_wav_header(self.sample_rate) if self.container == "wav" else b""

    def encode(self, pcm: np.ndarray) -> bytes:
        """Mono float32 at `sample_rate` -> this format's bytes."""
        if self.encoding == "pcm_f32le":
            return np.clip(pcm, -1.0, 1.0).astype("<f4").tobytes()
        if self.encoding == "pcm_s16le":
            return to_pcm16(pcm)
        samples = np.frombuffer(to_pcm16(pcm), dtype="<i2")
        return pcm16_to_ulaw(samples) if self.encoding == "pcm_mulaw" else pcm16_to_alaw(samples)


@dataclass(frozen=True)
class CartesiaSettings:
    """How a context (or a `/tts/bytes` request) is spoken."""

    request: SpeechRequest  # a template: every field but `request_id` and the text
    output: OutputFormat
    volume: float = 1.0
    separate_messages: bool = False  # `max_buffer_delay_ms: 0`: each message is a unit of its own

    def encode(self, pcm: np.ndarray) -> bytes:
        return self.output.encode(pcm * self.volume if self.volume != 1.0 else pcm)


def reject_unknown(body: dict, known: frozenset[str], within: str = "") -> None:
    """A 400 naming the first field of `body` not in `known` (`within`: the path of a nested `body`)."""
    unknown = sorted(set(body) - known)
    if unknown:
        param = f"{within}.{unknown[0]}" if within else unknown[0]
        raise APIError(400, f"Unrecognized field '{param}'.", param, "unknown_parameter")


def optional(body: dict, name: str, kind: type | tuple[type, ...], default=None, param: str | None = None):
    """`body[name]`, or `default` when it is absent or null; a 400 naming it (`param`: its whole path, when
    `body` is nested) when it has another type."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        names = {bool: "a boolean", str: "a string", dict: "an object", list: "a list", int: "an integer"}
        param = param or name
        raise APIError(400, f"'{param}' must be {names.get(kind, 'a number')}.", param)
    return value


def _number(body: dict, name: str, low: float, high: float, default: float, param: str) -> float:
    value = optional(body, name, (int, float), default, param)
    if not math.isfinite(value) or not low <= value <= high:
        raise APIError(400, f"'{param}' must be between {low:g} and {high:g}; got {value}.", param)
    return float(value)


def parse_settings(body: dict, info: ModelInfo, *, websocket: bool) -> CartesiaSettings:
    """A context's first message (`websocket`) or a `/tts/bytes` body -> its settings; a 400 names a bad field."""
    reject_unknown(body, WEBSOCKET_FIELDS if websocket else BYTES_FIELDS)
    _check_model(optional(body, "model_id", str), info)
    if optional(body, "pronunciation_dict_id", str) is not None:
        raise APIError(400, "Pronunciation dictionaries are not supported.", "pronunciation_dict_id")
    voice, embedding = _voice(optional(body, "voice", dict, {}), info)
    output = _output_format(optional(body, "output_format", dict, {}), websocket)
    generation = optional(body, "generation_config", dict, {})
    reject_unknown(generation, frozenset({"speed", "volume", "emotion"}), "generation_config")
    if optional(generation, "emotion", str, param="generation_config.emotion") is not None:
        raise APIError(400, f"Model '{info.name}' takes no emotion; leave generation_config.emotion unset.",
                       "generation_config.emotion")
    speed = _number(generation, "speed", 0.25, 4.0, 1.0, "generation_config.speed")
    volume = _number(generation, "volume", 0.0, 4.0, 1.0, "generation_config.volume")
    separate = False
    timestamps = False
    if websocket:
        timestamps = optional(body, "add_timestamps", bool, False)
        optional(body, "add_phoneme_timestamps", bool)  # accepted; no phoneme timings are sent
        optional(body, "use_normalized_timestamps", bool)  # the words are always the text's own
        delay = optional(body, "max_buffer_delay_ms", int)
        if delay is not None and not 0 <= delay <= 5000:
            raise APIError(400, "'max_buffer_delay_ms' must be between 0 and 5000.", "max_buffer_delay_ms")
        separate = delay == 0
    request = SpeechRequest(
        request_id="",
        voice=voice,
        language=model_language(optional(body, "language", str), info),
        speed=speed,
        speaker_embedding=embedding,
        sample_rate=output.sample_rate,
        word_timestamps=timestamps and info.word_timestamps,  # a model without timings just sends none
    )
    return CartesiaSettings(request, output, volume, separate)


def _check_model(model: str | None, info: ModelInfo) -> None:
    if model is not None and model != info.name and not model.startswith("sonic"):
        raise APIError(404, f"The model '{model}' does not exist. This server serves '{info.name}' (any Cartesia "
                            "model name also reaches it).", "model_id", "model_not_found")


def _voice(voice: dict, info: ModelInfo) -> tuple[str | None, bytes | None]:
    """`voice` -> (a StreamVox voice name or None for the default, an x-vector or None)."""
    if "__experimental_controls" in voice:
        raise APIError(400, "Voice controls are not supported; send generation_config.speed (Cartesia API version "
                            "2025-04-16 or later).", "voice.__experimental_controls")
    reject_unknown(voice, frozenset({"mode", "id", "embedding"}), "voice")
    mode = optional(voice, "mode", str, "id", "voice.mode")
    if mode == "id":
        name = optional(voice, "id", str, param="voice.id")
        if name is not None and name not in info.voices:
            raise APIError(400, f"Unknown voice '{name}'. GET /v1/audio/voices lists the voices of '{info.name}'.",
                           "voice.id", "voice_not_found")
        return name, None
    if mode != "embedding":
        raise APIError(400, f"Voice mode '{mode}' is not supported; use 'id' or 'embedding'.", "voice.mode")
    size = info.speaker_embedding_size
    if not size:
        raise APIError(400, f"Model '{info.name}' takes no speaker embeddings; use {{\"mode\": \"id\", \"id\": "
                            "...} with a voice from GET /v1/audio/voices.", "voice.embedding",
                       "embedding_unsupported")
    values = optional(voice, "embedding", list, [], "voice.embedding")
    if len(values) != size or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise APIError(400, f"'voice.embedding' must be a list of {size} numbers (model '{info.name}''s speaker "
                            "embedding size).", "voice.embedding")
    vector = np.asarray(values, dtype="<f4")
    if not np.isfinite(vector).all():
        raise APIError(400, "'voice.embedding' holds values that are not finite numbers.", "voice.embedding")
    return None, vector.tobytes()


def _output_format(fmt: dict, websocket: bool) -> OutputFormat:
    reject_unknown(fmt, frozenset({"container", "encoding", "sample_rate", "bit_rate"}), "output_format")
    containers = ("raw",) if websocket else ("raw", "wav")
    container = optional(fmt, "container", str, "raw", "output_format.container")
    if container not in containers:
        raise APIError(400, f"'output_format.container' must be {' or '.join(map(repr, containers))}.",
                       "output_format.container")
    encoding = optional(fmt, "encoding", str, "pcm_s16le", "output_format.encoding")
    encodings = ENCODINGS if container == "raw" else ("pcm_s16le",)
    if encoding not in encodings:
        raise APIError(400, f"'output_format.encoding' must be one of {', '.join(encodings)}.",
                       "output_format.encoding")
    rate = optional(fmt, "sample_rate", int, DEFAULT_SAMPLE_RATE, "output_format.sample_rate")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise APIError(400, f"'output_format.sample_rate' must be between {MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE}.",
                       "output_format.sample_rate")
    return OutputFormat(container, encoding, rate)


def model_language(language: str | None, info: ModelInfo) -> str | None:
    """A Cartesia language code ("en", "en-US") or a model's own name -> the model's name for it."""
    if language is None or not info.languages:
        return None
    by_key = {name.lower(): name for name in info.languages}
    code = language.strip().lower()
    base = code.split("-")[0].split("_")[0]
    # The code itself, its language, the language's name; else one of its regions (eSpeak's "en-us", "fr-fr").
    regions = sorted(key for key in by_key if key.startswith(base + "-"))
    for key in (code, base, LANGUAGE_NAMES.get(base), ESPEAK_NAMES.get(base), f"{base}-{base}", f"{base}-us",
                *regions[:1]):
        if key in by_key:
            return by_key[key]
    raise APIError(400, f"Unsupported language '{language}' for model '{info.name}'.", "language",
                   "unsupported_language")

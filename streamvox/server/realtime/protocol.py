"""The OpenAI Realtime protocol's vocabulary: the two dialects (GA and beta), event names, audio formats, the
session config and its parsing, object ids.

One connection speaks one dialect, chosen at connect time: beta when the client
sent `OpenAI-Beta: realtime=v1`, GA otherwise. `session.update` accepts either
session shape in both dialects (fields of the two shapes merge); what the
server sends back is always in the connection's own dialect.

`session.update` applies field by field: an invalid field (a voice the model
lacks, a speed out of range, ...) gets an `error` event naming it and keeps its
value, the valid fields apply, then `session.updated` follows. Fields the
server does not act on (tools, tracing, temperature, ...) are accepted and
echoed where the upstream session object has them; unknown fields are ignored
so that clients written for newer upstream versions keep working.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from streamvox.agent.vad import VadConfigError, VadSettings
from streamvox.audio.formats import to_pcm16
from streamvox.audio.g711 import pcm16_to_alaw, pcm16_to_ulaw
from streamvox.contract import ModelInfo
from streamvox.server.errors import APIError
from streamvox.server.word_timestamps import ALIGNER_FLAG

MIN_RATE, MAX_RATE = 8000, 48000
MAX_INSTRUCTIONS_CHARS = 32768


def new_id(prefix: str) -> str:
    """A protocol object's id (session, conversation, item, response, event); engine requests get
    `streamvox.engine.client.new_request_id`."""
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


class Dialect(Enum):
    GA = "ga"
    BETA = "beta"


# Server event names that differ between the dialects (docs/realtime.md).
_NAMES = {
    "audio.delta": ("response.output_audio.delta", "response.audio.delta"),
    "audio.done": ("response.output_audio.done", "response.audio.done"),
    "transcript.delta": ("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
    "transcript.done": ("response.output_audio_transcript.done", "response.audio_transcript.done"),
    "text.delta": ("response.output_text.delta", "response.text.delta"),
    "text.done": ("response.output_text.done", "response.text.done"),
}


def event_name(dialect: Dialect, key: str) -> str:
    ga, beta = _NAMES[key]
    return ga if dialect is Dialect.GA else beta


def assistant_content_type(dialect: Dialect, audio: bool) -> str:
    if dialect is Dialect.GA:
        return "output_audio" if audio else "output_text"
    return "audio" if audio else "text"


@dataclass(frozen=True)
class AudioFormat:
    """A wire audio format: s16le PCM at `rate`, or G.711 (8 kHz, one byte a sample)."""

    encoding: str = "pcm16"  # "pcm16" | "g711_ulaw" | "g711_alaw"
    rate: int = 24000

    _GA_TYPES = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}

    @property
    def bytes_per_second(self) -> int:
        return self.rate * (2 if self.encoding == "pcm16" else 1)

    def encode(self, pcm: np.ndarray) -> bytes:
        """float32 samples at `rate` -> wire bytes."""
        if self.encoding == "pcm16":
            return to_pcm16(pcm)
        samples = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)
        return pcm16_to_ulaw(samples) if self.encoding == "g711_ulaw" else pcm16_to_alaw(samples)

    def render(self, dialect: Dialect) -> dict | str:
        if dialect is Dialect.BETA:
            return self.encoding
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": self._GA_TYPES[self.encoding]}

    @classmethod
    def parse(cls, value: object, param: str) -> AudioFormat:
        """GA `{"type": "audio/pcm", "rate": 24000}` or beta `"pcm16"` / `"g711_ulaw"` / `"g711_alaw"`."""
        if isinstance(value, str):
            if value in ("pcm16", "g711_ulaw", "g711_alaw"):
                return cls(value, 24000 if value == "pcm16" else 8000)
            raise APIError(400, f"'{param}' must be one of pcm16, g711_ulaw, g711_alaw; got '{value}'.", param=param)
        if not isinstance(value, dict):
            raise APIError(400, f"'{param}' must be an object like {{\"type\": \"audio/pcm\", \"rate\": 24000}}.",
                           param=param)
        kind = value.get("type", "audio/pcm")
        encodings = {v: k for k, v in cls._GA_TYPES.items()}
        if not isinstance(kind, str) or kind not in encodings:
            raise APIError(400, f"'{param}.type' must be audio/pcm, audio/pcmu or audio/pcma; got {kind!r}.",
                           param=f"{param}.type")
        if encodings[kind] != "pcm16":
            return cls(encodings[kind], 8000)
        rate = value.get("rate", 24000)
        if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
            raise APIError(400, f"'{param}.rate' must be an integer between {MIN_RATE} and {MAX_RATE} "
                                "(24000 is the upstream default).", param=f"{param}.rate")
        return cls("pcm16", rate)


@dataclass(frozen=True)
class SessionConfig:
    """The session as the server uses it; rendered per dialect."""

    model: str
    voice: str
    speed: float = 1.0
    instructions: str = ""
    audio_output: bool = True  # False: text-only responses ("output_modalities": ["text"])
    text_output: bool = False  # beta's ["text", "audio"] sends audio with its transcript
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    turn_detection: dict | None = None
    transcription: dict | None = None
    noise_reduction: dict | None = None
    tools: list = field(default_factory=list)
    tool_choice: object = "auto"
    temperature: float = 0.8
    max_output_tokens: int | str = "inf"
    tracing: object = None
    word_timestamps: bool = False  # a StreamVox option: one transcript delta per word, with its start_time

    def modalities(self, dialect: Dialect) -> list[str]:
        if dialect is Dialect.GA:
            return ["audio"] if self.audio_output else ["text"]
        return ["text", "audio"] if self.audio_output else ["text"]

    def render(self, dialect: Dialect, session_id: str, info: ModelInfo, agent: dict | None = None) -> dict:
        """The session object; `agent`: what the voice agent says of itself (None: the echo responder, no ASR)."""
        streamvox = {"responder": "echo", "asr": None, "engine_model": info.name,
                     "engine_sample_rate": info.sample_rate, "word_timestamps": self.word_timestamps, **(agent or {})}
        if dialect is Dialect.GA:
            return {
                "type": "realtime",
                "object": "realtime.session",
                "id": session_id,
                "model": self.model,
                "output_modalities": self.modalities(dialect),
                "instructions": self.instructions,
                "audio": {
                    "input": {"format": self.input_format.render(dialect), "transcription": self.transcription,
                              "noise_reduction": self.noise_reduction, "turn_detection": self.turn_detection},
                    "output": {"format": self.output_format.render(dialect), "voice": self.voice,
                               "speed": self.speed},
                },
                "tools": self.tools,
                "tool_choice": self.tool_choice,
                "max_output_tokens": self.max_output_tokens,
                "tracing": self.tracing,
                "truncation": "auto",
                "prompt": None,
                "include": None,
                "streamvox": streamvox,
            }
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "modalities": self.modalities(dialect),
            "instructions": self.instructions,
            "voice": self.voice,
            "speed": self.speed,
            "input_audio_format": self.input_format.render(dialect),
            "output_audio_format": self.output_format.render(dialect),
            "input_audio_transcription": self.transcription,
            "input_audio_noise_reduction": self.noise_reduction,
            "turn_detection": self.turn_detection,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "temperature": self.temperature,
            "max_response_output_tokens": self.max_output_tokens,
            "tracing": self.tracing,
            "streamvox": streamvox,
        }


def default_config(info: ModelInfo, model: str | None) -> SessionConfig:
    voice = "alloy" if "alloy" in info.voices else info.default_voice
    return SessionConfig(model=model or info.name, voice=voice)


def parse_voice(value: object, info: ModelInfo, param: str) -> str:
    if isinstance(value, dict):  # GA also takes {"id": "voice_..."}
        value = value.get("id")
    if not isinstance(value, str) or value not in info.voices:
        raise APIError(400, f"Unknown voice {value!r} for model '{info.name}'. GET /v1/audio/voices lists them.",
                       param=param)
    return value


def parse_speed(value: object, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):  # math.isfinite overflows on huge ints
        raise APIError(400, f"'{param}' must be a number.", param=param)
    if not 0.25 <= value <= 4.0:
        raise APIError(400, f"'{param}' must be between 0.25 and 4.0; got {value}.", param=param)
    return float(value)


def parse_modalities(value: object, param: str) -> tuple[bool, bool]:
    """-> (audio_output, text_output)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value) \
            or not set(value) <= {"text", "audio"}:
        raise APIError(400, f"'{param}' must be a non-empty list of 'text' and/or 'audio'.", param=param)
    return "audio" in value, "text" in value


def _optional_dict(value: object, param: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise APIError(400, f"'{param}' must be an object or null.", param=param)
    return value


def parse_turn_detection(value: object, param: str) -> dict | None:
    """`turn_detection`: null (off), or server VAD (`semantic_vad` runs as server VAD) with valid fields."""
    if _optional_dict(value, param) is None:
        return None
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise APIError(400, f"'{param}.type' must be server_vad or semantic_vad; got {kind!r}.", param=f"{param}.type")
    try:
        VadSettings.from_turn_detection(value)
    except VadConfigError as exc:
        raise APIError(400, f"'{param}.{exc.field}' {exc}.", param=f"{param}.{exc.field}") from exc
    return value


class _Changes:
    """The changes one `session.update` asks for, field by field: a bad field is recorded and left out."""

    def __init__(self) -> None:
        self.values: dict = {}
        self.errors: list[APIError] = []

    def add(self, name: str, parse: Callable[..., object], *args: object) -> None:
        """`values[name] = parse(*args)`, or the `APIError` it raised recorded."""
        try:
            self.values[name] = parse(*args)
        except APIError as error:
            self.errors.append(error)


def _string(value: object, param: str, limit: int | None = None) -> str:
    if not isinstance(value, str) or (limit is not None and len(value) > limit):
        raise APIError(400, f"'{param}' must be a string" + (f" of at most {limit} characters." if limit else "."),
                       param=param)
    return value


def _audio_part(audio: dict, key: str) -> dict:
    part = audio.get(key) or {}
    if not isinstance(part, dict):
        raise APIError(400, f"'session.audio.{key}' must be an object.", param=f"session.audio.{key}")
    return part


def _temperature(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, "'session.temperature' must be a number.", param="session.temperature")
    return float(value)


def _token_limit(value: object, param: str) -> int | str:
    if value != "inf" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise APIError(400, f"'{param}' must be a positive integer or 'inf'.", param=param)
    return value


def _list(value: object, param: str) -> list:
    if not isinstance(value, list):
        raise APIError(400, f"'{param}' must be a list.", param=param)
    return value


def apply_session_update(config: SessionConfig, session: object,
                         info: ModelInfo) -> tuple[SessionConfig, list[APIError]]:
    """`config` with `session` (GA or beta shape) applied field by field: (the new config, one error for each
    invalid field, which keeps its value). A `session` that is not a realtime session object raises `APIError`."""
    if not isinstance(session, dict):
        raise APIError(400, "'session' must be an object.", param="session", code="missing_required_parameter")
    kind = session.get("type")
    if kind is not None and kind != "realtime":
        raise APIError(400, f"Session type {kind!r} is not supported here; use 'realtime'.", param="session.type")
    changes = _Changes()
    if (model := session.get("model")) is not None:
        changes.add("model", _string, model, "session.model")
    if (instructions := session.get("instructions")) is not None:
        changes.add("instructions", _string, instructions, "session.instructions", MAX_INSTRUCTIONS_CHARS)
    for key in ("output_modalities", "modalities"):
        if (value := session.get(key)) is not None:
            changes.add("modalities", parse_modalities, value, f"session.{key}")

    # beta: flat fields
    if (voice := session.get("voice")) is not None:
        changes.add("voice", parse_voice, voice, info, "session.voice")
    if (speed := session.get("speed")) is not None:
        changes.add("speed", parse_speed, speed, "session.speed")
    if (fmt := session.get("input_audio_format")) is not None:
        changes.add("input_format", AudioFormat.parse, fmt, "session.input_audio_format")
    if (fmt := session.get("output_audio_format")) is not None:
        changes.add("output_format", AudioFormat.parse, fmt, "session.output_audio_format")
    if "turn_detection" in session:
        changes.add("turn_detection", parse_turn_detection, session["turn_detection"], "session.turn_detection")
    for key, name in (("input_audio_transcription", "transcription"),
                      ("input_audio_noise_reduction", "noise_reduction")):
        if key in session:
            changes.add(name, _optional_dict, session[key], f"session.{key}")

    # GA: nested audio config
    audio = session.get("audio")
    if audio is not None and not isinstance(audio, dict):
        changes.errors.append(APIError(400, "'session.audio' must be an object.", param="session.audio"))
    elif audio is not None:
        for direction in ("input", "output"):
            param = f"session.audio.{direction}"
            try:
                part = _audio_part(audio, direction)
            except APIError as error:
                changes.errors.append(error)
                continue
            if (fmt := part.get("format")) is not None:
                changes.add(f"{direction}_format", AudioFormat.parse, fmt, f"{param}.format")
            if direction == "input":
                if "turn_detection" in part:
                    changes.add("turn_detection", parse_turn_detection, part["turn_detection"],
                                f"{param}.turn_detection")
                for key in ("transcription", "noise_reduction"):
                    if key in part:
                        changes.add(key, _optional_dict, part[key], f"{param}.{key}")
            else:
                if (voice := part.get("voice")) is not None:
                    changes.add("voice", parse_voice, voice, info, f"{param}.voice")
                if (speed := part.get("speed")) is not None:
                    changes.add("speed", parse_speed, speed, f"{param}.speed")

    # accepted and echoed, not acted on
    if (tools := session.get("tools")) is not None:
        changes.add("tools", _list, tools, "session.tools")
    for key in ("tool_choice", "tracing"):
        if key in session:
            changes.values[key] = session[key]
    if (temperature := session.get("temperature")) is not None:
        changes.add("temperature", _temperature, temperature)
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if (limit := session.get(key)) is not None:
            changes.add("max_output_tokens", _token_limit, limit, f"session.{key}")
    if (options := session.get("streamvox")) is not None:
        changes.add("streamvox", parse_streamvox_options, options, info)
    values = changes.values
    values.update(values.pop("streamvox", {}))
    if (modalities := values.pop("modalities", None)) is not None:
        values["audio_output"], values["text_output"] = modalities
    return replace(config, **values), changes.errors


def parse_streamvox_options(value: object, info: ModelInfo) -> dict:
    """`session.streamvox` -> config changes. Its only option is `word_timestamps`; the other keys of the session
    object's `streamvox` (what the server says of itself, which a client may send back) are ignored."""
    if not isinstance(value, dict):
        raise APIError(400, "'session.streamvox' must be an object.", param="session.streamvox")
    changes = {}
    if (flag := value.get("word_timestamps")) is not None:
        param = "session.streamvox.word_timestamps"
        if not isinstance(flag, bool):
            raise APIError(400, f"'{param}' must be a boolean.", param=param)
        if flag and not info.word_timestamps:
            raise APIError(400, f"Model '{info.name}' has no word aligner, so it cannot send word timestamps; start "
                                f"the server with {ALIGNER_FLAG} to enable them.", param=param,
                           code="word_timestamps_unavailable")
        changes["word_timestamps"] = flag
    return changes


def item_text(item: dict) -> str:
    """The words of a message item: its text parts and audio transcripts."""
    if item.get("type") != "message":
        return ""
    parts = []
    for part in item.get("content") or []:
        for key in ("text", "transcript"):
            value = part.get(key)
            if isinstance(value, str) and value.strip():
                parts.append(value.strip())
                break
    return " ".join(parts)

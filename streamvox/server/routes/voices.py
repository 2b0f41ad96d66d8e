"""Voices: `GET /v1/audio/voices`, `POST /v1/audio/voices` (clone a voice), `DELETE /v1/audio/voices/{name}`.

A cloned voice is reference audio (plus, optionally, its transcript `ref_text`) under a name. On a
model with `ModelInfo.voice_cloning` (a Qwen3-TTS Base checkpoint) the upload is decoded, persisted
in the voices directory, and registered with the engine core, which derives the speaker embedding
(and, with `ref_text`, the reference codes) once. The name is then a `voice` on every speech route.

On disk (`--voices-dir`, default `$XDG_DATA_HOME/streamvox/voices` or `~/.local/share/streamvox/voices`),
one directory per voice:

    <name>/audio.wav    the decoded upload: mono float32 WAV at the upload's sample rate
    <name>/voice.json   name, ref_text, sample_rate, duration_s, created_at, consent

The audio is stored rather than model-specific tensors, so a voice survives a change of Base
checkpoint. Every started engine core (the first and each restart) gets the stored voices before it
is marked ready. Writes go to a hidden temporary directory that is renamed into place, so a
half-written voice is never loaded. Disk work and audio decoding run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import soundfile
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from streamvox.engine.client import VoiceSample
from streamvox.engine.events import EngineUnavailable, VoiceRefused
from streamvox.server.errors import APIError
from streamvox.server.media_fetch import MAX_REF_AUDIO_BYTES
from streamvox.server.speech_params import MAX_REF_TEXT_CHARS, decode_audio_file

log = logging.getLogger(__name__)

MAX_VOICES = 256
MAX_UPLOAD_BODY_BYTES = MAX_REF_AUDIO_BYTES + 64 * 1024  # the audio file plus the form's other fields
CONSENT_VALUES = {"true", "1", "yes", "y", "on", "agree", "agreed", "i agree", "affirmed", "i consent", "consent"}
VOICE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a voice's name is also its directory's


def sanitize_voice_name(name: object, param: str = "name") -> str:
    """A voice name for storage (e.g. `POST /v1/audio/voices`): `[A-Za-z0-9_-]{1,64}` or a 400."""
    if not isinstance(name, str) or VOICE_NAME.fullmatch(name) is None:
        raise APIError(400, "A voice name is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'.", param,
                       "invalid_voice_name")
    return name


def default_voices_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "streamvox" / "voices"


class VoiceStore:
    """Cloned voices persisted under one directory (see the module docstring). Blocking: use threads."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def load_all(self) -> list[VoiceSample]:
        if not self.root.is_dir():
            return []
        samples = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            if VOICE_NAME.fullmatch(entry.name) is None:
                log.warning("ignoring %s: not a valid voice name", entry)
                continue
            try:
                samples.append(self._load(entry))
            except (OSError, ValueError, KeyError, soundfile.LibsndfileError) as exc:
                log.warning("ignoring stored voice %s: %s", entry, exc)
        return samples

    def entries(self) -> dict[str, tuple[int, int]]:
        """Stored voice names -> (inode, ctime) of each one's directory: they change when a name is stored again."""
        if not self.root.is_dir():
            return {}
        found = {}
        for entry in os.scandir(self.root):
            if not entry.name.startswith(".") and entry.is_dir() and VOICE_NAME.fullmatch(entry.name):
                stat = entry.stat()
                found[entry.name] = (stat.st_ino, stat.st_ctime_ns)
        return found

    def load(self, name: str) -> VoiceSample:
        return self._load(self.root / sample_name(name))

    @staticmethod
    def _load(entry: Path) -> VoiceSample:
        meta = json.loads((entry / "voice.json").read_text())
        if meta.get("name") != entry.name:
            raise ValueError("voice.json names another voice")
        pcm, rate = soundfile.read(entry / "audio.wav", dtype="float32", always_2d=True)
        return VoiceSample(entry.name, pcm.mean(axis=1).astype(np.float32), int(rate), meta.get("ref_text"), meta)

    def save(self, sample: VoiceSample) -> None:
        """Write the voice atomically; `FileExistsError` if a voice of that name is already stored."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / sample.name
        if final.exists():
            raise FileExistsError(sample.name)
        staging = self.root / f".tmp-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            soundfile.write(staging / "audio.wav", sample.pcm, sample.sample_rate, subtype="FLOAT")
            (staging / "voice.json").write_text(json.dumps(sample.meta, indent=1))
            os.rename(staging, final)  # fails if `final` appeared meanwhile (a non-empty directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def delete(self, name: str) -> None:
        final = self.root / sample_name(name)
        if not final.exists():
            return
        trash = self.root / f".del-{uuid.uuid4().hex}"
        os.rename(final, trash)  # gone from the store at once, even if removing the files is slow
        shutil.rmtree(trash, ignore_errors=True)


def sample_name(name: str) -> str:
    if VOICE_NAME.fullmatch(name) is None:  # never let anything else reach a path
        raise ValueError(f"invalid voice name {name!r}")
    return name


def _cloning_error(model: str) -> APIError:
    return APIError(400, f"The model '{model}' does not support voice cloning; it speaks only its built-in "
                         "voices (voice cloning needs a Qwen3-TTS Base checkpoint).", "audio",
                    "voice_cloning_unsupported")


def _cloning_engine(request: Request):
    """The engine, once it is ready and its model clones voices (else the API error to return)."""
    engine = request.app.state.streamvox.engine
    if engine.info is None or not engine.is_ready:
        raise APIError(503, "The speech engine is not available.", code="engine_unavailable")
    if not engine.info.voice_cloning:
        raise _cloning_error(engine.info.name)
    return engine


async def list_voices(request: Request) -> Response:
    engine = request.app.state.streamvox.engine
    info = engine.info
    if info is None:
        return JSONResponse({"voices": []})
    builtin = engine.base_info.voices if engine.base_info is not None else info.voices
    custom = [{"name": name, **_public_meta(meta)} for name, meta in sorted(engine.voices.items())]
    return JSONResponse({"model": info.name, "default_voice": info.default_voice, "voices": info.voices,
                         "builtin_voices": builtin, "custom_voices": custom, "languages": info.languages,
                         "voice_cloning": info.voice_cloning})


def _public_meta(meta: dict) -> dict:
    keys = ("ref_text", "sample_rate", "duration_s", "created_at")
    return {"object": "voice", **{k: meta.get(k) for k in keys}, "consent": bool(meta.get("consent"))}


async def _read_form(request: Request):
    """The multipart form, read under a byte cap (also for chunked bodies without Content-Length)."""
    too_large = APIError(413, f"The upload is larger than {MAX_UPLOAD_BODY_BYTES} bytes.", code="body_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_UPLOAD_BODY_BYTES:
        raise too_large
    content_type = request.headers.get("content-type", "").lower()  # media types are case-insensitive
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise APIError(400, "Upload a voice as multipart/form-data with the fields 'audio' (file), 'name', "
                            "'consent' and optionally 'ref_text'.", code="invalid_content_type")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_UPLOAD_BODY_BYTES:
            raise too_large
        parts.append(chunk)
    request._body = b"".join(parts)  # `form()` parses the body read above instead of the stream
    try:
        return await request.form(max_files=1, max_fields=16, max_part_size=MAX_REF_TEXT_CHARS * 4)
    except Exception as exc:  # starlette's MultiPartException and parser errors: a malformed form
        raise APIError(400, f"The multipart form could not be parsed: {exc}", code="invalid_form") from exc


def _text_field(form, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise APIError(400, f"'{name}' must be a text field, not a file.", name)
    return value


async def upload_voice(request: Request) -> Response:
    state = request.app.state.streamvox
    try:
        engine = _cloning_engine(request)
        form = await _read_form(request)
        try:
            response = await _add_voice(request, state, engine, form)
        finally:
            await form.close()
        return response
    except APIError as error:
        return error.response()


async def _add_voice(request: Request, state, engine, form) -> Response:
    name = sanitize_voice_name(_text_field(form, "name"))
    consent = (_text_field(form, "consent") or "").strip().lower()
    if consent not in CONSENT_VALUES:
        raise APIError(400, "'consent' is required: affirm (consent=true) that the speaker in the audio agreed "
                            "to having their voice cloned.", "consent", "consent_required")
    ref_text = _text_field(form, "ref_text")
    ref_text = ref_text.strip() or None if ref_text is not None else None
    if ref_text is not None and len(ref_text) > MAX_REF_TEXT_CHARS:
        raise APIError(400, f"'ref_text' is longer than {MAX_REF_TEXT_CHARS} characters.", "ref_text")
    upload = form.get("audio", form.get("file"))
    if not isinstance(upload, UploadFile):
        raise APIError(400, "'audio' is required: the voice sample as a file (wav, flac or ogg).", "audio")
    base = engine.base_info or engine.info
    if name in base.voices:
        raise APIError(409, f"'{name}' is a built-in voice of '{base.name}'.", "name", "voice_exists")
    if name in engine.voices or name in state.voice_pending:
        raise APIError(409, f"A voice named '{name}' already exists; DELETE /v1/audio/voices/{name} first.",
                       "name", "voice_exists")
    if len(engine.voices) + len(state.voice_pending) >= MAX_VOICES:
        raise APIError(400, f"The server holds its maximum of {MAX_VOICES} cloned voices.", "name",
                       "too_many_voices")
    state.voice_pending.add(name)
    try:
        raw = await upload.read(MAX_REF_AUDIO_BYTES + 1)
        pcm, rate = await asyncio.to_thread(decode_audio_file, raw, "audio")
        meta = {"name": name, "ref_text": ref_text, "sample_rate": rate, "duration_s": round(len(pcm) / rate, 3),
                "created_at": int(time.time()), "consent": {"affirmed": True, "value": consent},
                "filename": upload.filename}
        sample = VoiceSample(name, pcm, rate, ref_text, meta)
        # Persist first: an engine restart in between then restores the voice too (registering is idempotent).
        try:
            await asyncio.to_thread(state.voice_store.save, sample)
        except FileExistsError as exc:
            raise APIError(409, f"A voice named '{name}' already exists.", "name", "voice_exists") from exc
        except OSError as exc:
            log.error("could not store voice %r: %s", name, exc)
            raise APIError(500, "The voice could not be stored.", code="storage_error") from exc
        try:
            await engine.add_voice(sample)
        except (VoiceRefused, EngineUnavailable) as exc:
            engine.remove_voice(name)
            await asyncio.to_thread(state.voice_store.delete, name)
            if isinstance(exc, EngineUnavailable):
                raise APIError(503, "The speech engine stopped while adding the voice; try again.",
                               code="engine_unavailable") from exc
            param = {"ref_audio": "audio", "ref_sample_rate": "audio"}.get(exc.param, exc.param)
            raise APIError(400, f"The voice sample was refused: {exc.message}", param, exc.code) from exc
    finally:
        state.voice_pending.discard(name)
    return JSONResponse({"name": name, **_public_meta(meta)}, status_code=201)


async def delete_voice(request: Request) -> Response:
    state = request.app.state.streamvox
    try:
        engine = _cloning_engine(request)
        name = request.path_params["name"]
        base = engine.base_info or engine.info
        if name in base.voices:
            raise APIError(400, f"'{name}' is a built-in voice; only cloned voices can be deleted.", "name")
        if VOICE_NAME.fullmatch(name) is None or name not in engine.voices or name in state.voice_pending:
            raise APIError(404, f"No cloned voice named '{name}'.", "name", "voice_not_found")
        engine.remove_voice(name)
        try:
            await asyncio.to_thread(state.voice_store.delete, name)
        except OSError as exc:
            log.error("could not delete stored voice %r: %s", name, exc)
            raise APIError(500, "The voice was removed but its files could not be deleted.",
                           code="storage_error") from exc
        return JSONResponse({"object": "voice.deleted", "name": name, "deleted": True})
    except APIError as error:
        return error.response()

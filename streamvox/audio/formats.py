"""Audio containers for the wire: s16le PCM, a streaming WAV header, whole files, content types.

The engine produces mono float32 PCM at the rate each request asked for
(`streamvox.audio.resample` runs in the engine core). Everything a client
receives passes through here: s16le PCM, a streaming WAV, or a whole file.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile
import soxr

FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
STREAMABLE_FORMATS = ("pcm", "wav")  # formats `stream_format=audio` can carry
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# (container format, encoder) for the formats PyAV writes.
_AV_ENCODERS = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac")}


def to_pcm16(pcm: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> s16le bytes (clipped)."""
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A RIFF/WAVE header for a stream of unknown length: both size fields are 0xFFFFFFFF."""
    unknown = 0xFFFFFFFF
    block_align = channels * bits // 8
    return (
        b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, bits)
        + b"data" + struct.pack("<I", unknown)
    )


def encode_audio(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode a whole mono float32 clip as `fmt` (one of FORMATS)."""
    if fmt == "pcm":
        return to_pcm16(pcm)
    if fmt in ("wav", "flac"):
        buffer = io.BytesIO()
        soundfile.write(buffer, np.clip(pcm, -1.0, 1.0), sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buffer.getvalue()
    if fmt in _AV_ENCODERS:
        return _encode_with_av(pcm, sample_rate, fmt)
    raise ValueError(f"unknown audio format {fmt!r}")


def encoded_sample_rate(sample_rate: int, fmt: str) -> int:
    """The rate a file of `fmt` will carry when asked for `sample_rate` (opus allows only a few)."""
    if fmt == "opus" and sample_rate not in _OPUS_RATES:
        return 48000
    return sample_rate


def _encode_with_av(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    import av  # FFmpeg is large: loaded only when a compressed format is asked for

    rate = encoded_sample_rate(sample_rate, fmt)
    if rate != sample_rate:
        pcm = soxr.resample(pcm, sample_rate, rate)
    container_format, codec = _AV_ENCODERS[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        samples = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()

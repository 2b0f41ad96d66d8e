"""Audio containers for the wire: s16le PCM, WAV, FLAC, MP3, Ogg Opus and ADTS AAC, streamed or whole.

The engine produces mono float32 PCM at the rate each request asked for
(`streamvox.audio.resample` runs in the engine core). Everything a client
receives passes through here: a stream, delta by delta (`StreamEncoder`), or
a whole file (`encode_audio`).
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import numpy as np
import soundfile

from streamvox.audio.resample import Resampler

FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
# The rates each lossy encoder takes (FFmpeg's `audio_rates` for libopus, libmp3lame and aac, ascending): a
# stream of one of these formats carries the lowest of them at or above the rate asked for.
CODEC_RATES = {
    "opus": (8000, 12000, 16000, 24000, 48000),
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "aac": (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000),
}
# (container format, encoder) for the formats PyAV writes.
_AV_ENCODERS = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac"),
                "flac": ("flac", "flac")}
# Muxer options: the same audio always gives the same bytes (else the Ogg serial number is random); an Ogg
# page per 20 ms Opus packet (the default holds pages back for up to 1 s); no 8 KiB FLAC padding block (room
# to edit tags in a file, none in a stream).
_MUXER_OPTIONS = {"ogg": {"page_duration": "20000"}, "flac": {"metadata_header_padding": "0"}}


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
    """Encode a whole mono float32 clip as `fmt` (one of FORMATS). wav and flac files carry their length
    (libsndfile writes them); the other formats are the stream `StreamEncoder` writes, in one piece. So is a
    flac file of no samples: libsndfile writes no bytes at all for one, the stream a header."""
    if fmt == "wav" or (fmt == "flac" and len(pcm)):
        buffer = io.BytesIO()
        soundfile.write(buffer, np.clip(pcm, -1.0, 1.0), sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buffer.getvalue()
    encoder = StreamEncoder(fmt, sample_rate)
    return encoder.encode(pcm) + encoder.finish()


def encoded_sample_rate(sample_rate: int, fmt: str) -> int:
    """The rate a file or stream of `fmt` carries when asked for `sample_rate` (opus, mp3 and aac take only a
    few: the audio is resampled up to the next of them)."""
    rates = CODEC_RATES.get(fmt)
    if rates is None:
        return sample_rate
    return next((rate for rate in rates if rate >= sample_rate), rates[-1])


class StreamEncoder:
    """One response's audio as a stream of `fmt`, delta by delta (one encoder per request).

    `encode(pcm)` returns the bytes that continue the stream: a decoder can play them as they arrive.
    `finish()` returns the end of it (what the codec still held, the container's trailer). pcm and wav are
    s16le (wav behind a header of unknown length); mp3, opus (Ogg), aac (ADTS) and flac go through FFmpeg
    (PyAV) into a write-only sink, so every muxer writes a stream and never seeks back. One caller at a time.
    """

    def __init__(self, fmt: str, sample_rate: int) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown audio format {fmt!r}")
        self.format = fmt
        self.input_rate = sample_rate
        self.sample_rate = encoded_sample_rate(sample_rate, fmt)  # what the stream carries
        self._header = streaming_wav_header(sample_rate) if fmt == "wav" else b""
        self._av: _AvStream | None = None  # opened by the first call: where the costly work runs

    @property
    def costly(self) -> bool:
        """True for the FFmpeg formats: too slow for an event loop (a 0.5 s delta takes 0.2 ms as flac, 2 ms
        as opus, 5 ms as aac and 8 ms as mp3, measured on a shared 2-core machine); pcm and wav take 0.01 ms."""
        return self.format in _AV_ENCODERS

    def encode(self, pcm: np.ndarray) -> bytes:
        if self.costly:
            return self._av_stream().write(pcm)
        header, self._header = self._header, b""
        return header + to_pcm16(pcm)

    def finish(self) -> bytes:
        if self.costly:
            return self._av_stream().close()
        header, self._header = self._header, b""
        return header

    def _av_stream(self) -> _AvStream:
        if self._av is None:
            self._av = _AvStream(self.format, self.input_rate, self.sample_rate)
        return self._av


class _Sink:
    """A write-only file for FFmpeg: what it wrote since the last `take()`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts = []
        return data


class _AvStream:
    """A PyAV container and encoder writing one stream into a `_Sink`."""

    def __init__(self, fmt: str, in_rate: int, rate: int) -> None:
        import av  # FFmpeg is large: loaded only when a compressed format is asked for

        self._av = av
        container_format, codec = _AV_ENCODERS[fmt]
        self._sink = _Sink()
        options = {"fflags": "+bitexact", **_MUXER_OPTIONS.get(container_format, {})}
        self._container = av.open(self._sink, mode="w", format=container_format, options=options)
        self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        self._resampler = Resampler(in_rate, rate) if rate != in_rate else None
        self._rate = rate
        self._samples = 0

    def write(self, pcm: np.ndarray) -> bytes:
        if self._resampler is not None:
            pcm = self._resampler.process(pcm)
        self._encode(pcm)
        return self._sink.take()

    def close(self) -> bytes:
        if self._resampler is not None:
            self._encode(self._resampler.flush())
        self._container.start_encoding()  # the header, even for a stream without audio
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.take()

    def _encode(self, pcm: np.ndarray) -> None:
        if not len(pcm):
            return
        samples = np.frombuffer(to_pcm16(pcm), dtype="<i2").reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._samples
        frame.time_base = Fraction(1, self._rate)
        self._samples += len(pcm)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

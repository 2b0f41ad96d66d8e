"""Container encoding: s16le conversion, the streaming WAV header, whole files at the rate they can carry."""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile

from streamvox.audio.formats import (
    CONTENT_TYPES,
    FORMATS,
    encode_audio,
    encoded_sample_rate,
    streaming_wav_header,
    to_pcm16,
)


def test_to_pcm16_scales_and_clips():
    data = to_pcm16(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0], dtype=np.float32))
    assert np.frombuffer(data, "<i2").tolist() == [0, 16383, -16383, 32767, -32767, 32767, -32767]


def test_streaming_wav_header_describes_mono_s16le_of_unknown_length():
    header = streaming_wav_header(24000)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", header[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<IHHIIHH", header[16:36]) == (16, 1, 1, 24000, 48000, 2, 16)
    assert header[36:40] == b"data" and struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF


def test_whole_files_decode_back_to_the_audio():
    pcm = (0.25 * np.sin(np.arange(2400) / 10)).astype(np.float32)
    assert set(CONTENT_TYPES) == set(FORMATS)
    assert encode_audio(pcm, 24000, "pcm") == to_pcm16(pcm)
    for fmt in ("wav", "flac"):
        decoded, rate = soundfile.read(io.BytesIO(encode_audio(pcm, 24000, fmt)), dtype="float32")
        assert rate == 24000
        np.testing.assert_allclose(decoded, pcm, atol=1 / 16384)


def test_opus_carries_only_its_own_rates():
    assert encoded_sample_rate(24000, "opus") == 24000
    assert encoded_sample_rate(22050, "opus") == 48000
    assert encoded_sample_rate(22050, "mp3") == 22050

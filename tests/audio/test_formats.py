"""Container encoding: s16le conversion, the streaming WAV header, streams delta by delta, whole files at the rate
they can carry."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile

from streamvox.audio.formats import (
    CODEC_RATES,
    CONTENT_TYPES,
    FORMATS,
    StreamEncoder,
    encode_audio,
    encoded_sample_rate,
    streaming_wav_header,
    to_pcm16,
)

# What a codec adds or drops at the ends (encoder delay, frame padding), at most: mp3 and aac add 1100-1800
# samples at any rate, which is more than 0.1 s below 16 kHz.
CODEC_PADDING_S = 0.1
CODEC_PADDING_SAMPLES = 2048


def _av_decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode with FFmpeg (PyAV), as a streaming client would."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    if frames and frames[0].dtype == np.int16:
        return np.concatenate(frames).astype(np.float32) / 32768, rate
    return (np.concatenate(frames) if frames else np.zeros(0, np.float32)), rate


def _playable(prefix: bytes) -> int:
    """How many samples a decoder plays from the start of a stream (0 before the first packet)."""
    try:
        return len(_av_decode(prefix)[0])
    except av.error.FFmpegError:
        return 0


def _speech_like(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


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


def test_lossy_formats_carry_the_next_rate_their_encoder_takes():
    for fmt, codec in (("opus", "libopus"), ("mp3", "libmp3lame"), ("aac", "aac")):
        assert CODEC_RATES[fmt] == tuple(sorted(av.codec.Codec(codec, "w").audio_rates))
    assert encoded_sample_rate(24000, "opus") == 24000
    assert encoded_sample_rate(22050, "opus") == 24000
    assert encoded_sample_rate(22050, "mp3") == 22050
    assert encoded_sample_rate(10000, "mp3") == 11025
    assert encoded_sample_rate(12345, "aac") == 16000
    assert encoded_sample_rate(47999, "aac") == 48000
    assert encoded_sample_rate(12345, "wav") == encoded_sample_rate(12345, "flac") == 12345


def test_a_flac_file_of_no_samples_is_a_flac_stream_of_none():
    data = encode_audio(np.zeros(0, np.float32), 24000, "flac")
    assert data[:4] == b"fLaC"
    decoded, rate = _av_decode(data)
    assert len(decoded) == 0 and rate == 24000


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("rate", [24000, 22050, 10000])
def test_a_stream_plays_as_it_arrives_and_decodes_to_the_audio(fmt, rate):
    pcm = _speech_like(2.0, rate)
    encoder = StreamEncoder(fmt, rate)
    deltas = [encoder.encode(pcm[i:i + 2400]) for i in range(0, len(pcm), 2400)] + [encoder.finish()]
    assert sum(1 for delta in deltas if delta) > 5  # bytes leave with (nearly) every delta, not at the end
    played = [_playable(b"".join(deltas[:i + 1])) for i in range(len(deltas))]
    assert max(played[:4]) > 0  # the first ~0.4 s of input already plays (codec delay aside)
    first = next(i for i, samples in enumerate(played) if samples)
    assert played[first:] == sorted(played[first:])  # from then on every prefix decodes, each one further
    decoded, decoded_rate = _av_decode(b"".join(deltas))
    assert encoder.sample_rate == encoded_sample_rate(rate, fmt)
    assert decoded_rate == (48000 if fmt == "opus" else encoder.sample_rate)  # an Opus decoder gives 48 kHz
    padding = max(CODEC_PADDING_S, CODEC_PADDING_SAMPLES / encoder.sample_rate)
    assert abs(len(decoded) / decoded_rate - len(pcm) / rate) <= padding
    if fmt in ("wav", "flac"):  # lossless: the s16le samples themselves
        assert to_pcm16(decoded * 32768 / 32767) == to_pcm16(pcm) or np.abs(decoded - pcm).max() <= 1 / 32767


def test_stream_of_pcm_and_wav_is_the_s16le_of_each_delta():
    pcm = _speech_like(0.5, 24000)
    for fmt, head in (("pcm", b""), ("wav", streaming_wav_header(24000))):
        encoder = StreamEncoder(fmt, 24000)
        assert not encoder.costly
        deltas = [encoder.encode(pcm[:1000]), encoder.encode(pcm[1000:]), encoder.finish()]
        assert deltas == [head + to_pcm16(pcm[:1000]), to_pcm16(pcm[1000:]), b""]
    assert StreamEncoder("wav", 16000).finish() == streaming_wav_header(16000)  # no audio: a valid, empty wav


def test_compressed_files_are_the_stream_in_one_piece():
    pcm = _speech_like(1.0, 24000)
    for fmt in ("mp3", "opus", "aac"):
        encoder = StreamEncoder(fmt, 24000)
        assert encoder.costly
        assert encode_audio(pcm, 24000, fmt) == encoder.encode(pcm) + encoder.finish()
        assert StreamEncoder(fmt, 24000).finish() == encode_audio(np.zeros(0, np.float32), 24000, fmt)

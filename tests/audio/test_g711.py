"""G.711 codecs: bit-exact against CPython's audioop where it exists, and round-trip properties."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from streamvox.audio.g711 import alaw_to_pcm16, pcm16_to_alaw, pcm16_to_ulaw, ulaw_to_pcm16

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)
CODES = bytes(range(256))


def _audioop():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import audioop
        except ImportError:  # removed in Python 3.13
            pytest.skip("audioop is not available")
    return audioop


def test_matches_audioop_for_every_sample_and_code():
    audioop = _audioop()
    raw = ALL_SAMPLES.tobytes()
    assert pcm16_to_ulaw(ALL_SAMPLES) == audioop.lin2ulaw(raw, 2)
    assert pcm16_to_alaw(ALL_SAMPLES) == audioop.lin2alaw(raw, 2)
    assert ulaw_to_pcm16(CODES).tobytes() == audioop.ulaw2lin(CODES, 2)
    assert alaw_to_pcm16(CODES).tobytes() == audioop.alaw2lin(CODES, 2)


@pytest.mark.parametrize("encode,decode", [(pcm16_to_ulaw, ulaw_to_pcm16), (pcm16_to_alaw, alaw_to_pcm16)])
def test_round_trip(encode, decode):
    decoded = decode(encode(ALL_SAMPLES)).astype(np.int32)
    error = np.abs(decoded - ALL_SAMPLES.astype(np.int32))
    # logarithmic quantisation: the error grows with the magnitude, about 1/32 of it at most
    assert np.all(error <= np.maximum(32, np.abs(ALL_SAMPLES.astype(np.int32)) // 16))
    assert np.all(np.sign(decoded[np.abs(ALL_SAMPLES) > 64]) == np.sign(ALL_SAMPLES[np.abs(ALL_SAMPLES) > 64]))
    levels = decode(CODES)
    assert np.array_equal(decode(encode(levels)), levels)  # every decoded level encodes back to itself

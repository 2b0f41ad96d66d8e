"""G.711 mu-law and A-law (ITU-T G.711), the telephony formats of the Realtime API.

Vectorised versions of the classic segment-search encoders: 16-bit linear PCM
in, one byte per sample out (and back).
"""

from __future__ import annotations

import numpy as np


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2(x)) for positive integers, exactly (frexp: x = m * 2**e with m in [0.5, 1))."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int32) - 1


def pcm16_to_ulaw(samples: np.ndarray) -> bytes:
    x = samples.astype(np.int32) >> 2  # 14-bit
    mask = np.where(x < 0, 0x7F, 0xFF)
    x = np.minimum(np.minimum(np.abs(x), 8159) + 33, 8191)
    segment = _floor_log2(x) - 5
    code = (segment << 4) | ((x >> (segment + 1)) & 0x0F)
    return (code ^ mask).astype(np.uint8).tobytes()


def pcm16_to_alaw(samples: np.ndarray) -> bytes:
    x = samples.astype(np.int32) >> 3  # 13-bit
    mask = np.where(x >= 0, 0xD5, 0x55)
    x = np.where(x >= 0, x, -x - 1)
    x = np.minimum(x, 4095)
    segment = np.where(x < 32, 0, _floor_log2(np.maximum(x, 1)) - 4)
    shift = np.maximum(segment, 1)
    code = (segment << 4) | ((x >> shift) & 0x0F)
    return (code ^ mask).astype(np.uint8).tobytes()


def _ulaw_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    sign, exponent, mantissa = code & 0x80, (code >> 4) & 0x07, code & 0x0F
    value = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(sign, -value, value).astype(np.int16)


def _alaw_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    sign, exponent, mantissa = code & 0x80, (code >> 4) & 0x07, code & 0x0F
    value = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(sign, value, -value).astype(np.int16)


_ULAW_TO_PCM16 = _ulaw_table()
_ALAW_TO_PCM16 = _alaw_table()


def ulaw_to_pcm16(data: bytes) -> np.ndarray:
    return _ULAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]


def alaw_to_pcm16(data: bytes) -> np.ndarray:
    return _ALAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)]

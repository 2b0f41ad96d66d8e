"""Qwen3-TTS-12Hz speech tokenizer encoder: shapes, determinism, round trip (tiny checkpoint).

Code-for-code parity with the reference is in test_qwen3_code2wav_ref.py.
"""

from __future__ import annotations

import pytest
import torch

from streamvox.models.qwen3_tts.codec.encoder import CodecEncoder
from tests.helpers.qwen3_tiny_codec import TINY_ENCODER_CONFIG, build_tiny_speech_tokenizer


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> CodecEncoder:
    tok = build_tiny_speech_tokenizer(tmp_path_factory.mktemp("qwen3_enc") / "speech_tokenizer", seed=3)
    return CodecEncoder.from_pretrained(tok)


def _pcm(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 24000.0
    return 0.3 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(n, generator=g)


@pytest.mark.parametrize("n", [1, 1919, 1920, 1921, 24000])
def test_frame_count(encoder: CodecEncoder, n: int) -> None:
    codes = encoder.encode(_pcm(n))
    assert codes.shape == (-(-n // 1920), 16)
    assert codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < TINY_ENCODER_CONFIG["codebook_size"]


def test_deterministic_and_causal(encoder: CodecEncoder) -> None:
    x = _pcm(48000, seed=1)
    a = encoder.encode(x)
    assert torch.equal(a, encoder.encode(x.clone()))
    # the encoder is causal: changing the second half leaves early frames alone
    y = x.clone()
    y[24000:] = _pcm(24000, seed=9)
    b = encoder.encode(y)
    assert torch.equal(a[:10], b[:10])
    assert not torch.equal(a[14:], b[14:])


def test_rejects_bad_input(encoder: CodecEncoder) -> None:
    with pytest.raises(ValueError):
        encoder.encode(torch.zeros(2, 100))
    with pytest.raises(ValueError):
        encoder.encode(torch.zeros(0))

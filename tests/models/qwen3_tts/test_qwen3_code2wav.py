"""Qwen3-TTS-12Hz code2wav: offline decode and exact batched per-request streaming (tiny checkpoint)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav, StreamState, agreement_db
from streamvox.models.qwen3_tts.runtime.loader import FLOAT16_MIN_DB, load_codec
from tests.helpers.qwen3_tiny_codec import TINY_DECODER_CONFIG, build_tiny_speech_tokenizer

SPF = 1920
TOL = 1e-4
CODEBOOK = TINY_DECODER_CONFIG["codebook_size"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_speech_tokenizer(tmp_path_factory.mktemp("qwen3_codec") / "speech_tokenizer")


@pytest.fixture(scope="module")
def model(tok_dir: Path) -> Code2Wav:
    return Code2Wav.from_pretrained(tok_dir, device="cpu", dtype=torch.float32)


def _codes(seed: int, t: int, b: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK, (b, 16, t), generator=g)


def _stream(model: Code2Wav, codes: list[torch.Tensor], plans: list[list[int]]) -> list[torch.Tensor]:
    """Stream several requests together; round r gives request i the next plans[i][r] frames."""
    states = [model.new_stream_state() for _ in codes]
    pos = [0] * len(codes)
    outs: list[list[torch.Tensor]] = [[] for _ in codes]
    for r in range(max(len(p) for p in plans)):
        chunk = []
        for i, c in enumerate(codes):
            n = plans[i][r] if r < len(plans[i]) else 0
            chunk.append(c[:, pos[i] : pos[i] + n])
            pos[i] += n
        got = model.decode_stream(chunk, states)
        for i, o in enumerate(got):
            assert o.shape == (chunk[i].shape[1] * SPF,)
            outs[i].append(o)
    assert pos == [c.shape[1] for c in codes]
    return [torch.cat(o) for o in outs]


def test_config_and_offline_decode(model: Code2Wav) -> None:
    assert model.samples_per_frame == SPF
    assert model.sample_rate == 24000
    codes = _codes(0, 30, b=2)
    wav = model.decode(codes)
    assert wav.shape == (2, 30 * SPF) and wav.dtype == torch.float32
    assert torch.isfinite(wav).all()
    # a real signal, not silence or a saturated square wave
    assert wav.std() > 0.05
    assert (wav.abs() >= 1.0).float().mean() < 0.01
    # rows are independent: decoding row 1 alone gives the same audio
    assert (model.decode(codes[1:]) - wav[1:]).abs().max() <= TOL
    # different codes give different audio
    assert (model.decode(_codes(1, 30)) - wav[:1]).abs().max() > 0.01


def test_decoder_is_causal(model: Code2Wav) -> None:
    """Changing frame k must not change any sample before k * 1920 (what exact streaming relies on)."""
    codes = _codes(2, 20)
    other = codes.clone()
    other[:, :, 12:] = (other[:, :, 12:] + 7) % CODEBOOK
    a, b = model.decode(codes)[0], model.decode(other)[0]
    assert (a[: 12 * SPF] - b[: 12 * SPF]).abs().max() <= 1e-6
    assert (a[12 * SPF :] - b[12 * SPF :]).abs().max() > 0.01


@pytest.mark.parametrize("chunk", [1, 2, 7, 25])
def test_stream_equals_offline_fixed_chunks(model: Code2Wav, chunk: int) -> None:
    t = 30  # several times the tiny sliding window (8), so the window really slides
    codes = _codes(3, t, b=2)
    ref = model.decode(codes)
    plan = [chunk] * (t // chunk) + ([t % chunk] if t % chunk else [])
    got = _stream(model, [codes[i] for i in range(2)], [plan] * 2)
    for i in range(2):
        assert (got[i] - ref[i]).abs().max().item() <= TOL


def test_stream_equals_offline_uneven_mixed_batch(model: Code2Wav) -> None:
    """Requests at different positions with different (and zero) chunk sizes in the same calls."""
    lens = [23, 17, 30]
    codes = [_codes(10 + i, n)[0] for i, n in enumerate(lens)]
    plans = [[1, 5, 0, 9, 8], [4, 0, 0, 13], [2, 7, 15, 1, 5]]
    got = _stream(model, codes, plans)
    for c, g in zip(codes, got, strict=True):
        ref = model.decode(c[None])[0]
        assert g.shape == ref.shape
        assert (g - ref).abs().max().item() <= TOL


def test_request_joins_mid_stream(model: Code2Wav) -> None:
    """A fresh request batched with one that is already far along gets its own solo result."""
    a, b = _codes(20, 30)[0], _codes(21, 12)[0]
    sa, sb = model.new_stream_state(), model.new_stream_state()
    out_a = [model.decode_stream([a[:, :18]], [sa])[0]]
    pieces = model.decode_stream([a[:, 18:24], b[:, :6]], [sa, sb])
    out_a.append(pieces[0])
    out_b = [pieces[1]]
    pieces = model.decode_stream([b[:, 6:], a[:, 24:]], [sb, sa])
    out_b.append(pieces[0])
    out_a.append(pieces[1])
    assert (torch.cat(out_a) - model.decode(a[None])[0]).abs().max() <= TOL
    assert (torch.cat(out_b) - model.decode(b[None])[0]).abs().max() <= TOL


def test_one_batched_forward_per_call(model: Code2Wav) -> None:
    calls: list[int] = []
    handle = model.decoder.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    try:
        states = [model.new_stream_state() for _ in range(4)]
        codes = [_codes(30 + i, 5)[0] for i in range(4)]
        model.decode_stream(codes, states)
        model.decode_stream([c[:, :3] for c in codes[:2]] + [c[:, :1] for c in codes[2:]], states)
    finally:
        handle.remove()
    assert calls == [4, 4]


def test_state_is_bounded_and_freed(model: Code2Wav) -> None:
    codes = _codes(40, 60)[0]
    st = model.new_stream_state()
    model.decode_stream([codes[:, :10]], [st])
    size_10 = st.nbytes()
    model.decode_stream([codes[:, 10:60]], [st])
    assert st.frames == 60
    assert st.nbytes() == size_10 > 0  # sliding window + conv tails: constant size
    ref = weakref.ref(next(iter(st.tails.values())))
    del st
    gc.collect()
    assert ref() is None


def test_bad_inputs(model: Code2Wav) -> None:
    st = model.new_stream_state()
    with pytest.raises(ValueError):
        model.decode(torch.zeros(1, 8, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        model.decode_stream([torch.zeros(15, 3, dtype=torch.long)], [st])
    with pytest.raises(ValueError):
        model.decode_stream([torch.zeros(16, 3, dtype=torch.long)] * 2, [st, st])
    with pytest.raises(ValueError):
        model.decode_stream([torch.zeros(16, 3, dtype=torch.long)], [st, StreamState()])
    with pytest.raises(ValueError, match="codebook_size"):
        model.decode_stream([torch.full((16, 2), CODEBOOK, dtype=torch.long)], [st])
    with pytest.raises(ValueError, match="codebook_size"):
        model.decode(torch.full((1, 16, 2), CODEBOOK, dtype=torch.long))
    assert st.frames == 0 and not st.tails


def test_from_pretrained_rejects_wrong_weights(tok_dir: Path, tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((tok_dir / "config.json").read_text())
    state = load_file(str(tok_dir / "model.safetensors"))
    state.pop("decoder.pre_conv.conv.weight")
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="pre_conv"):
        Code2Wav.from_pretrained(bad)
    cfg = json.loads((tok_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_tts_tokenizer_12hz"


def test_prime_with_reference_codes(model: Code2Wav) -> None:
    """Voice cloning decodes [ref codes + generated codes] and drops the ref audio: priming the
    stream with the ref codes (output discarded) gives exactly the generated part."""
    ref_codes, gen = _codes(50, 11)[0], _codes(51, 14)[0]
    full = model.decode(torch.cat([ref_codes, gen], dim=1)[None])[0]
    st = model.new_stream_state()
    model.decode_stream([ref_codes], [st])
    got = torch.cat([model.decode_stream([gen[:, s : s + 4]], [st])[0] for s in range(0, 14, 4)])
    assert (got - full[11 * SPF :]).abs().max() <= TOL


def test_model_dir_and_bf16(tok_dir: Path, tmp_path: Path) -> None:
    """A full model dir (with `speech_tokenizer/` inside) loads too; bf16 runs and stays close to fp32."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_tts"}')
    (tmp_path / "speech_tokenizer").symlink_to(tok_dir, target_is_directory=True)
    m32 = Code2Wav.from_pretrained(tmp_path)
    m16 = Code2Wav.from_pretrained(tok_dir, dtype=torch.bfloat16)
    codes = _codes(60, 12)
    a, b = m32.decode(codes)[0], m16.decode(codes)[0].float()
    assert m16.decode(codes).dtype == torch.bfloat16
    assert torch.isfinite(b).all()
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1]
    assert corr > 0.9, corr


def test_float16_agreement_and_the_auto_choice(tok_dir: Path, model: Code2Wav) -> None:
    """`agreement_db` ranks dtypes as their precision does (float16 closer to float32 than bfloat16), says
    -inf when float16 overflows, and the runner's "auto" decoder takes float16 only where it agrees (on
    CUDA; on the CPU it stays float32)."""
    half = Code2Wav.from_pretrained(tok_dir, dtype=torch.float16)
    bf16 = Code2Wav.from_pretrained(tok_dir, dtype=torch.bfloat16)
    db16, db_bf16 = agreement_db(model, half), agreement_db(model, bf16)
    assert db16 > db_bf16 + 10 and db16 > FLOAT16_MIN_DB, (db16, db_bf16)
    with torch.no_grad():
        half.decoder.pre_conv.conv.weight.mul_(1e4)  # activations past float16's range
    assert agreement_db(model, half) == float("-inf")
    assert load_codec(tok_dir, "cpu", "auto").decoder.pre_conv.conv.weight.dtype == torch.float32
    assert load_codec(tok_dir, "cpu", "float16").decoder.pre_conv.conv.weight.dtype == torch.float16

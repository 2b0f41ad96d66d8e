"""Parity of StreamVox's Qwen3-TTS-12Hz speech tokenizer with the reference `qwen-tts` package.

The reference runs in its own virtualenv (it needs transformers), as a subprocess:
python from $STREAMVOX_REF_PYTHON, default `.ref-venv/bin/python` under the repo root.
A missing reference is a failure, not a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
from streamvox.models.qwen3_tts.codec.encoder import CodecEncoder
from tests.helpers.qwen3_tiny_codec import TINY_DECODER_CONFIG, build_tiny_speech_tokenizer

REPO = Path(__file__).resolve().parents[3]
RUNNER = REPO / "tests" / "helpers" / "qwen3_codec_ref_runner.py"
TOL = 1e-4
# decode: lengths up to the reference's 300-frame chunk (beyond it the reference re-decodes
# with 25 frames of left context, an approximation); several lengths in one padded batch
DECODE_LENGTHS = [60, 37, 1, 9]
# encode: 1.3 s, under one frame, exactly two frames, 6 s (longer than the encoder's window)
ENCODE_LENGTHS = [31200, 1000, 3840, 24000 * 6 + 7]


def ref_python() -> Path:
    env = os.environ.get("STREAMVOX_REF_PYTHON")
    path = Path(env) if env else REPO / ".ref-venv" / "bin" / "python"
    if not path.exists():
        pytest.fail(
            f"reference python not found at {path}: build a virtualenv with `pip install qwen-tts` "
            "there or point STREAMVOX_REF_PYTHON at one"
        )
    return path


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the tiny checkpoint, write inputs, run the reference once; return (tokenizer dir, job dir)."""
    py = ref_python()
    root = tmp_path_factory.mktemp("qwen3_codec_ref")
    tok = build_tiny_speech_tokenizer(root / "speech_tokenizer", seed=7)
    job = root / "job"
    job.mkdir()
    g = torch.Generator().manual_seed(11)
    for i, t in enumerate(DECODE_LENGTHS):
        codes = torch.randint(0, TINY_DECODER_CONFIG["codebook_size"], (t, 16), generator=g)
        np.save(job / f"decode_{i}.npy", codes.numpy())
    for i, n in enumerate(ENCODE_LENGTHS):
        time = torch.arange(n) / 24000.0
        pcm = 0.3 * torch.sin(2 * torch.pi * (150 + 60 * i) * time) + 0.05 * torch.randn(n, generator=g)
        np.save(job / f"encode_{i}.npy", pcm.float().numpy())
    proc = subprocess.run(
        [str(py), str(RUNNER), str(tok), str(job)], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(f"reference runner failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    if "newly initialized" in proc.stderr or "not used when initializing" in proc.stderr:
        pytest.fail(f"reference did not load the tiny checkpoint cleanly:\n{proc.stderr[-4000:]}")
    return tok, job


def test_decode_matches_reference(ref_run: tuple[Path, Path]) -> None:
    tok, job = ref_run
    model = Code2Wav.from_pretrained(tok, device="cpu", dtype=torch.float32)
    for i, t in enumerate(DECODE_LENGTHS):
        codes = torch.from_numpy(np.load(job / f"decode_{i}.npy"))
        ours = model.decode(codes.T[None])[0]
        for kind in ("decoded", "raw"):
            ref = torch.from_numpy(np.load(job / f"{kind}_{i}.npy"))
            assert ref.shape == (t * 1920,) == ours.shape
            diff = (ours - ref).abs().max().item()
            assert diff <= TOL, f"request {i} ({t} frames) {kind}: max abs diff {diff}"
        assert ref.std() > 0.05  # the comparison is over real signal


def test_stream_matches_reference(ref_run: tuple[Path, Path]) -> None:
    """Streaming in uneven chunks, all requests batched per call, reproduces the reference audio."""
    tok, job = ref_run
    model = Code2Wav.from_pretrained(tok)
    codes = [torch.from_numpy(np.load(job / f"decode_{i}.npy")).T for i in range(len(DECODE_LENGTHS))]
    states = [model.new_stream_state() for _ in codes]
    outs: list[list[torch.Tensor]] = [[] for _ in codes]
    pos = [0] * len(codes)
    for r, step in enumerate([1, 6, 25, 3, 30]):
        chunk = []
        for i, c in enumerate(codes):
            n = min(step + i, c.shape[1] - pos[i]) if r < 4 else c.shape[1] - pos[i]
            chunk.append(c[:, pos[i] : pos[i] + n])
            pos[i] += n
        for i, o in enumerate(model.decode_stream(chunk, states)):
            outs[i].append(o)
    for i, c in enumerate(codes):
        ref = torch.from_numpy(np.load(job / f"decoded_{i}.npy"))
        got = torch.cat(outs[i])
        assert got.shape == ref.shape == (c.shape[1] * 1920,)
        assert (got - ref).abs().max().item() <= TOL


def test_encode_matches_reference(ref_run: tuple[Path, Path]) -> None:
    tok, job = ref_run
    enc = CodecEncoder.from_pretrained(tok, device="cpu", dtype=torch.float32)
    for i, n in enumerate(ENCODE_LENGTHS):
        pcm = torch.from_numpy(np.load(job / f"encode_{i}.npy"))
        ours = enc.encode(pcm)
        ref = torch.from_numpy(np.load(job / f"encoded_{i}.npy"))
        assert ours.dtype == torch.long
        assert ours.shape == ref.shape == (-(-n // 1920), 16)
        mismatched = (ours != ref).sum().item()
        assert mismatched == 0, f"clip {i}: {mismatched} of {ref.numel()} codes differ"
    # the codes carry information: the long clip uses many distinct codes per codebook
    assert min(len(torch.unique(ours[:, k])) for k in range(16)) >= 3

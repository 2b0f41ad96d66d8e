"""Text to audio through `load_runner` with the checkpoint's own speech tokenizer, against the reference.

The streamed PCM deltas of our runner, concatenated, must match the upstream `qwen-tts` waveform for the
same greedy generation (CustomVoice, and Base in-context cloning where the reference codes come from the
speech tokenizer's encoder on both sides: `codec/encoder.py` here).
"""

from __future__ import annotations

import numpy as np
import pytest

from streamvox.contract import SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.runtime.loader import load_runner
from tests.helpers.qwen3_harness import RecordingSink, drain, make_signal, pcm_bytes, run_reference
from tests.helpers.qwen3_tiny import build_tiny_checkpoint
from tests.helpers.qwen3_tiny_codec import build_tiny_speech_tokenizer

FRAMES = 10
CODEBOOK = 64  # the tiny speech tokenizer's codebook size
TEXT = "Hello world, this is streaming speech!"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    return {
        task: build_tiny_checkpoint(root / task, task, seed=21 + i, codebook_size=CODEBOOK,
                                    speech_tokenizer_builder=lambda d: build_tiny_speech_tokenizer(d, seed=3))
        for i, task in enumerate(("custom_voice", "base"))
    }


def _ours(model_dir, request: SpeechRequest) -> np.ndarray:
    runner = load_runner(model_dir)
    assert runner.codec is not None
    sink = RecordingSink()
    runner.add(request)
    drain(runner, sink)
    assert request.request_id in sink.done, sink.errors
    chunks = sink.audio_chunks[request.request_id]
    assert len(chunks) >= 2, "audio should stream in several deltas"
    return np.concatenate(chunks)


def test_end_to_end_audio_matches_reference(dirs):
    sr = 16000
    ref_pcm = make_signal(sr, 1.0, seed=9)
    results = run_reference([
        dict(full=True, model_dir=dirs["custom_voice"], cases=[
            dict(task="custom_voice", text=TEXT, speaker="alice", language="english", max_frames=FRAMES)]),
        dict(full=True, model_dir=dirs["base"], cases=[
            dict(task="base", text=TEXT, language="english", ref_audio=ref_pcm.tolist(), ref_sr=sr,
                 ref_text="Hi there, friend.", max_frames=FRAMES)]),
    ])
    greedy = SamplingParams(temperature=0, max_new_tokens=FRAMES)
    ours_cv = _ours(dirs["custom_voice"], SpeechRequest(request_id="cv", text=TEXT, voice="alice",
                                                        language="english", sampling=greedy,
                                                        initial_codec_chunk_frames=3))
    ours_icl = _ours(dirs["base"], SpeechRequest(request_id="icl", text=TEXT, language="english",
                                                 ref_audio=pcm_bytes(ref_pcm), ref_sample_rate=sr,
                                                 ref_text="Hi there, friend.", sampling=greedy,
                                                 initial_codec_chunk_frames=2))
    for ours, ref in ((ours_cv, results[0]["wavs"][0]), (ours_icl, results[1]["wavs"][0])):
        ref = np.asarray(ref, dtype=np.float32)
        if ref.size == ours.size + 1:
            # Upstream cuts the reference part as int(ref_frames / all_frames * samples), which float
            # rounding can leave one sample short; the extra sample is the reference audio's last.
            ref = ref[1:]
        assert ours.shape == ref.shape
        assert np.abs(ref).max() > 1e-3
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)

"""Our Qwen3-ForcedAligner equals the `qwen-asr` package's on a tiny random checkpoint (CPU, float32).

The reference runs in a subprocess with the reference venv's python (scripts/setup_reference_venv.sh,
STREAMVOX_REF_PYTHON) on the same directory, audio and words. Compared: the features it feeds the
model, the head's logits at every `<timestamp>` marker, the words' timings, and the repair of times
that go backwards. Clips stay under 8 s: the reference attends within 8 s windows only with flash
attention, and over the whole clip otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner
from streamvox.models.alignment.qwen3_aligner.features import log_mel_batch
from streamvox.models.alignment.qwen3_aligner.words import repaired, units
from tests.helpers.qwen3_aligner_tiny import RATE, build_tiny_aligner, speechlike
from tests.helpers.qwen3_harness import REPO, reference_python

# (duration s, text): lengths off the 10 ms hop and the 1 s chunk, a clip under one chunk, a number,
# punctuation alone, and CJK ideographs (each its own unit).
BATCHES = [
    [(3.0, "Hello world, this is - a small test of the aligner."), (2.0 + 77 / RATE, "Captions need 42 timings!")],
    [(0.55, "Quick, brown fox.")],
    [(6.5, "The quick brown fox jumps over the lazy dog, again and again and again."),
     (1.0, "你好 world"), (4.2, "Does it work? Yes: it does.")],
]
REPAIRS = [[80.0, 4000.0, 160.0, 240.0], [80.0, 160.0, 0.0, 0.0, 0.0, 800.0, 880.0], [500.0, 80.0, 160.0],
           [0.0, 0.0, 960.0, 400.0, 480.0, 560.0, 240.0, 320.0, 1200.0]]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("aligner-parity")
    model_dir = build_tiny_aligner(root / "tiny-aligner", seed=0)
    batches = []
    for b, batch in enumerate(BATCHES):
        items = []
        for i, (seconds, text) in enumerate(batch):
            path = root / f"clip_{b}_{i}.npy"
            np.save(path, speechlike(seconds, 10 * b + i))
            items.append({"audio": str(path), "text": text})
        batches.append(items)
    job = {"model_dir": str(model_dir), "out_dir": str(root), "batches": batches, "repairs": REPAIRS}
    proc = subprocess.run([reference_python(), str(REPO / "tests" / "helpers" / "qwen3_aligner_reference_job.py")],
                          input=json.dumps(job), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""})
    if proc.returncode != 0:
        pytest.fail(f"reference run failed:\n{proc.stderr[-4000:]}")
    reference = json.loads(proc.stdout.strip().splitlines()[-1])
    aligner = Qwen3ForcedAligner.from_pretrained(model_dir)
    ours = [[(np.load(item["audio"]), RATE, item["text"].split()) for item in batch] for batch in batches]
    return root, aligner, ours, reference


def test_features_match_the_reference_extractor(compared):
    root, aligner, ours, _ = compared
    for b, batch in enumerate(ours):
        features, frames = log_mel_batch([pcm for pcm, _, _ in batch], aligner.cfg.features)
        np.testing.assert_allclose(features.numpy(), np.load(root / f"features_{b}.npy"), rtol=0, atol=2e-5)
        assert frames == np.load(root / f"feature_mask_{b}.npy").sum(axis=1).tolist()


def test_timing_logits_match_the_reference(compared):
    root, aligner, ours, _ = compared
    for b, batch in enumerate(ours):
        logits = aligner.marker_logits(batch)
        assert len(logits) == len(batch)
        for i, got in enumerate(logits):
            expected = np.load(root / f"logits_{b}_{i}.npy")
            assert got.shape == expected.shape
            np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-4)
            top = np.sort(expected, axis=-1)[:, -2:]
            assert (top[:, 1] - top[:, 0]).min() > 1e-3  # no near-tie: the argmax comparison below means something


def test_word_timings_match_the_reference(compared):
    _, aligner, ours, reference = compared
    varied = set()
    for batch, expected_batch in zip(ours, reference["results"], strict=True):
        for (_, _, words), spans, expected in zip(batch, aligner.align_batch(batch), expected_batch, strict=True):
            assert [text for text, _, _ in expected] == [u for word in words for u in units(word)]
            assert len(spans) == len(words)
            k, previous_end = 0, 0.0
            for word, (start, end) in zip(words, spans, strict=True):
                count = len(units(word))
                if not count:
                    assert start == end == previous_end
                    continue
                assert (start, end) == (expected[k][1], expected[k + count - 1][2]), word
                k += count
                previous_end = end
            varied.update(start for start, _ in spans)
    assert len(varied) > 3  # the random head gives more than one time


def test_backward_times_are_repaired_as_the_reference_does(compared):
    *_, reference = compared
    assert [repaired(times) for times in REPAIRS] == reference["repairs"]


def test_align_and_align_batch_agree(compared):
    _, aligner, ours, _ = compared
    batch = ours[2]
    assert aligner.align_batch(batch) == [aligner.align(*item) for item in batch]

"""The aligner's padded forward (what its CUDA graphs replay) times words exactly as its eager forward does.

On the CPU, `graphs="1"` pads each batch to its bucket (clips, audio chunks, prompt length) and runs
`Thinker.forward_padded` directly; on CUDA the same padded forward is captured and replayed. Padding
rows, padded chunks (a window cut short), and padded prompt positions must change no real row's timings.
"""

from __future__ import annotations

import pytest
import torch

from streamvox.models.alignment.qwen3_aligner import graphed as graphed_module
from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner
from streamvox.models.alignment.qwen3_aligner.graphed import MAX_CLIPS, Bucket, bucket_for
from tests.helpers.qwen3_aligner_tiny import build_tiny_aligner
from tests.helpers.qwen3_aligner_tiny import speechlike_items as _items


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_aligner(tmp_path_factory.mktemp("aligner-graphs") / "tiny", seed=1)


def _aligners(model_dir) -> tuple[Qwen3ForcedAligner, Qwen3ForcedAligner]:
    eager = Qwen3ForcedAligner.from_pretrained(model_dir, graphs="0")
    padded = Qwen3ForcedAligner.from_pretrained(model_dir, graphs="1")
    return eager, padded


def test_buckets_pad_clips_chunks_and_prompts():
    assert bucket_for(3, 250, 70, chunk=100, per_window=8) == Bucket(4, 3, 96)
    assert bucket_for(1, 800, 64, chunk=100, per_window=8) == Bucket(1, 8, 64)
    assert bucket_for(16, 801, 65, chunk=100, per_window=8) == Bucket(16, 9, 96)  # whole chunks, past one window
    assert bucket_for(MAX_CLIPS + 1, 100, 64, chunk=100, per_window=8) is None
    assert bucket_for(1, 100, 1025, chunk=100, per_window=8) is None
    assert bucket_for(1, 3201, 64, chunk=100, per_window=8) is None  # past four windows


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_padded_batches_classify_as_eager_ones(model_dir):
    eager, padded = _aligners(model_dir)
    for items in (_items(1), _items(3), _items(4)):
        expected = eager.marker_classes(items)
        assert _same(padded.marker_classes(items), expected)
        assert padded.align_batch(items) == eager.align_batch(items)
    assert {b.clips for b in padded.graphed.buckets} == {1, 4}
    assert max(b.chunks for b in padded.graphed.buckets) == 11  # the 10.3 s clip: two windows, the second partial
    # Varied classes: a forward that ignored its audio or its prompt would not give these.
    assert len(torch.cat(expected).unique()) > 5


def test_batches_past_the_buckets_run_eagerly(model_dir):
    eager, padded = _aligners(model_dir)
    items = _items(MAX_CLIPS + 1)
    assert _same(padded.marker_classes(items), eager.marker_classes(items))
    assert padded.graphed.buckets == []


def test_past_the_held_graphs_a_batch_is_padded_to_a_larger_held_bucket(model_dir, monkeypatch):
    eager, padded = _aligners(model_dir)
    monkeypatch.setattr(graphed_module, "MAX_GRAPHS", 1)
    graphed, padded_runs = padded.graphed, []
    forward = graphed._forward
    monkeypatch.setattr(graphed, "_forward", lambda g: padded_runs.append(tuple(g.ids.shape)) or forward(g))
    for items in (_items(4), _items(3)[1:], _items(1)):  # held; padded further (2 of 4 clips); too small to pad
        assert _same(padded.marker_classes(items), eager.marker_classes(items))
        assert len(graphed.buckets) == 1 and graphed.buckets[0].clips == 4
    held = graphed.buckets[0]
    assert padded_runs == [(4, held.length)] * 2  # the third batch ran eagerly
    assert graphed._cover(Bucket(1, 1, 32)) is None  # more than MAX_COVER times its work
    assert padded.align_batch(_items(3)[1:]) == eager.align_batch(_items(3)[1:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_time_words_as_the_eager_forward(model_dir):
    eager = Qwen3ForcedAligner.from_pretrained(model_dir, "cuda", graphs="0")
    graphed = Qwen3ForcedAligner.from_pretrained(model_dir, "cuda")  # auto: graphs on CUDA
    for items in (_items(1), _items(4)):
        assert _same(graphed.marker_classes(items), eager.marker_classes(items))
    held = graphed.graphed.buckets  # the warm-up's at load, and these batches'
    assert any(bucket.clips == 4 for bucket in held)
    assert _same(graphed.marker_classes(_items(4)), eager.marker_classes(_items(4)))  # replays the graph of 4
    assert graphed.graphed.buckets == held

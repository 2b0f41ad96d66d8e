"""The aligner's text layers run as the fast path's fused stack (`TextModel.fuse`) time words as its plain layers do.

On the CPU the fused stack runs uncompiled; on CUDA its layer halves are compiled, as in serving.
"""

from __future__ import annotations

import pytest
import torch

from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner
from tests.helpers.qwen3_aligner_tiny import build_tiny_aligner, speechlike_items


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_aligner(tmp_path_factory.mktemp("aligner-fused") / "tiny", seed=2)


def _agree(plain: Qwen3ForcedAligner, fused: Qwen3ForcedAligner, tolerance: float) -> None:
    items = speechlike_items(4)
    for a, b in zip(plain.marker_logits(items), fused.marker_logits(items), strict=True):
        torch.testing.assert_close(b, a, atol=tolerance, rtol=tolerance)
    classes = plain.marker_classes(items)
    assert all(torch.equal(a, b) for a, b in zip(classes, fused.marker_classes(items), strict=True))
    assert len(torch.cat(classes).unique()) > 5  # varied classes: a forward that ignored its input would not agree
    assert fused.align_batch(items) == plain.align_batch(items)


def test_fused_text_layers_time_words_as_plain_ones(model_dir):
    plain = Qwen3ForcedAligner.from_pretrained(model_dir, graphs="0", fused="0")
    fused = Qwen3ForcedAligner.from_pretrained(model_dir, graphs="0", fused="1")
    assert plain.module.thinker.model.fused is None and fused.module.thinker.model.fused is not None
    _agree(plain, fused, 1e-4)
    padded = Qwen3ForcedAligner.from_pretrained(model_dir, graphs="1", fused="1")  # the graphs' padded forward
    _agree(plain, padded, 1e-4)
    assert padded.graphed.buckets


def test_fused_setting_is_checked(model_dir):
    with pytest.raises(ValueError, match="fused must be auto, 0 or 1"):
        Qwen3ForcedAligner.from_pretrained(model_dir, fused="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled layers run on CUDA")
def test_compiled_fused_layers_on_cuda(model_dir):
    plain = Qwen3ForcedAligner.from_pretrained(model_dir, "cuda", graphs="0", fused="0")
    fused = Qwen3ForcedAligner.from_pretrained(model_dir, "cuda")  # auto: fused, compiled, graphs
    assert fused.module.thinker.model.fused is not None and fused.graphed is not None
    _agree(plain, fused, 1e-3)

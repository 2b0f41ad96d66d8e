"""What the aligning runner asks of a word aligner (PocketSphinx on the CPU, Qwen3-ForcedAligner on the GPU)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

AlignItem = tuple[np.ndarray, int, list[str]]  # (mono pcm, its sample rate, the text's whitespace-separated words)
Spans = list[tuple[float, float]]  # (start, end) in seconds from the first sample, one per word


class AlignmentFailed(Exception):
    """The audio could not be aligned with the text (it does not say it, or says it too differently)."""


class WordAligner(Protocol):
    # The longest audio one alignment is trusted with (None: any the model takes): a request whose audio waiting
    # for timings grows past it gets partial alignments however fast it is generated.
    longest_job_s: float | None

    def align(self, pcm: np.ndarray, sample_rate: int, words: list[str]) -> Spans:
        """Each word's span; raises `AlignmentFailed`."""
        ...

    def align_batch(self, items: list[AlignItem], open_end: list[bool] | None = None) -> list[Spans | AlignmentFailed]:
        """`align` of each item: its spans, or its `AlignmentFailed` (one item's failure is not the others').

        `open_end[i]`: item i's audio may stop before its text does (a request still speaking); the words
        it does not reach get spans at (or squeezed towards) the audio's end."""
        ...

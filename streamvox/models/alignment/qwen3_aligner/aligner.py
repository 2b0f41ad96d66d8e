"""Qwen3-ForcedAligner-0.6B: when each word of a known text is spoken, for a batch of clips in one pass.

`Qwen3ForcedAligner.from_pretrained(dir_or_repo, device, dtype)` loads the checkpoint (config.json,
safetensors, tokenizer files) with no transformers dependency. `align_batch` pads several clips and their
prompts into one non-autoregressive forward on the device; `align` is one clip's batch. On CUDA that forward
is replayed from a CUDA graph per bucket of batch shape (`graphed.py`), its text layers are the fast path's
fused ones (`TextModel.fuse`), its features are made on the device from audio at any rate (`features.py`), and
the aligner runs on a stream of its own at the lowest priority (the speech model's work never waits on its
queue, and gets the SMs first), and not while the speech model captures a CUDA graph (`CAPTURE_LOCK`: a capture
fails if another thread allocates or synchronises meanwhile).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

from streamvox.models.alignment.qwen3_aligner.audio_encoder import encoded_length, sinusoids
from streamvox.models.alignment.qwen3_aligner.config import AlignerConfig, load_aligner_config
from streamvox.models.alignment.qwen3_aligner.features import log_mel_batch, resampled_length
from streamvox.models.alignment.qwen3_aligner.graphed import GraphedForward
from streamvox.models.alignment.qwen3_aligner.model import ForcedAligner
from streamvox.models.alignment.qwen3_aligner.words import (
    AUDIO_END,
    AUDIO_PAD,
    AUDIO_START,
    TIMESTAMP,
    prompt_text,
    repaired,
    units,
    word_spans,
)
from streamvox.models.alignment.word_aligner import AlignItem, AlignmentFailed, Spans
from streamvox.models.qwen3_tts.kernels.graphs import BACKGROUND_PRIORITY, CAPTURE_LOCK
from streamvox.models.qwen3_tts.model.checkpoint import load_state_dict, resolve_model_dir
from streamvox.models.qwen3_tts.model.layers import rope_inv_freq
from streamvox.models.qwen3_tts.text import load_tokenizer

_SILENT_PEAK = 1e-4  # a clip whose peak is below this says nothing to align


@dataclass
class _Prepared:
    index: int  # in the items asked for
    clip: np.ndarray  # float32
    rate: int
    words: list[str]


class Qwen3ForcedAligner:
    """Aligns mono audio with the words it says (any of the model's languages, one at a time: not thread-safe)."""

    longest_job_s: float | None = None  # its 5000 classes of 80 ms reach 400 s; its audio tower attends in windows

    def __init__(self, cfg: AlignerConfig, module: ForcedAligner, tokenizer, graphs: str = "auto",
                 fused: str = "auto") -> None:
        """`graphs`: "auto" replays the forward from CUDA graphs on CUDA and runs it eagerly elsewhere; "1" pads
        batches to the graphs' buckets on any device (the CPU runs the padded batch directly); "0" is eager.
        `fused`: "auto" runs the text layers as the fast path's fused layers (`TextModel.fuse`), compiled, on
        CUDA, and plain elsewhere; "1" fuses them on any device (compiled on CUDA only); "0" keeps them plain."""
        self.cfg = cfg
        self.module = module.eval().requires_grad_(False)
        self._tokenizer = tokenizer
        p = next(module.parameters())
        self.device, self.dtype = p.device, p.dtype
        special = {name: tokenizer.token_to_id(name) for name in (AUDIO_START, AUDIO_PAD, AUDIO_END, TIMESTAMP)}
        if None in special.values():
            missing = ", ".join(name for name, i in special.items() if i is None)
            raise ValueError(f"the aligner's tokenizer lacks {missing}")
        if special[AUDIO_PAD] != cfg.audio_token_id or special[TIMESTAMP] != cfg.timestamp_token_id:
            raise ValueError("the aligner's tokenizer and config.json disagree on the audio or timestamp token id")
        self._start, self._pad, self._end = special[AUDIO_START], special[AUDIO_PAD], special[AUDIO_END]
        # A unit's tokens and its two markers: the tokenizer splits the prompt at the markers (special tokens),
        # so the prompt's tokens are these, unit after unit.
        self._unit_ids = functools.lru_cache(maxsize=1 << 16)(
            lambda unit: tuple(tokenizer.encode(prompt_text([unit])).ids))
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device, priority=BACKGROUND_PRIORITY) if cuda else None
        for name, value in (("graphs", graphs), ("fused", fused)):
            if value not in ("auto", "0", "1"):
                raise ValueError(f"aligner {name} must be auto, 0 or 1, not {value!r}")
        if fused == "1" or (fused == "auto" and self._stream is not None):
            module.thinker.model.fuse(compiled=self._stream is not None)
        padded = graphs == "1" or (graphs == "auto" and self._stream is not None)
        self.graphed = GraphedForward(module.thinker, capture=self._stream is not None) if padded else None

    @classmethod
    def from_pretrained(cls, path_or_repo: str | os.PathLike[str], device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, graphs: str = "auto",
                        fused: str = "auto") -> Qwen3ForcedAligner:
        model_dir = resolve_model_dir(path_or_repo)
        cfg = load_aligner_config(model_dir)
        with torch.device("meta"):
            module = ForcedAligner(cfg)
        module.load_state_dict(load_state_dict(model_dir), strict=True, assign=True)
        # The position tables are not in the checkpoint: they were made on meta, make them for real (the
        # rotary frequencies in float32 whatever the dtype).
        inv_freq = rope_inv_freq(cfg.text.head_dim, cfg.text.rope_theta)
        module.thinker.audio_tower.positions = sinusoids(cfg.audio.max_source_positions, cfg.audio.d_model)
        module.thinker.model.rotary.inv_freq = inv_freq
        module = module.to(device=device, dtype=dtype)
        module.thinker.model.rotary.inv_freq = inv_freq.to(device)
        if torch.device(device).type == "cuda":  # the audio tower's convolutions run channels-last there
            module.thinker.audio_tower.to(memory_format=torch.channels_last)
        aligner = cls(cfg, module, load_tokenizer(model_dir), graphs, fused)
        if aligner._stream is not None:
            aligner.warm_up()
        return aligner

    def warm_up(self) -> None:
        """Align a short synthetic clip alone and then as a pair, so that compiling the fused layers (one
        batch row, then several) and the first graph captures happen at load rather than in the first
        requests, where they would hold the interpreter lock and `CAPTURE_LOCK` for seconds (on an H100, loading
        took 42 s with Inductor's cache cold, 16 s with it warm)."""
        rate = self.cfg.features.sampling_rate
        t = np.arange(rate) / rate
        item = ((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, ["warm", "up"])
        self.align_batch([item])
        self.align_batch([item, item])

    # aligning

    def align(self, pcm: np.ndarray, sample_rate: int, words: list[str]) -> Spans:
        """(start, end) in seconds from the first sample of `pcm` for each of `words` (the text's
        whitespace-separated words, verbatim). A word with nothing to say ("-") gets an empty span
        where the previous word ended. Raises `AlignmentFailed`."""
        result = self.align_batch([(pcm, sample_rate, words)])[0]
        if isinstance(result, AlignmentFailed):
            raise result
        return result

    def align_batch(self, items: list[AlignItem], open_end: list[bool] | None = None) -> list[Spans | AlignmentFailed]:
        """`align` for each (pcm, sample_rate, words), in one forward: spans, or the item's `AlignmentFailed`.

        `open_end` needs nothing here: words the audio does not reach are squeezed at its end anyway."""
        results, batch = self._prepare(items)
        if batch:
            with self._on_device():
                classes = self._classes(batch)
            for prepared, part in zip(batch, classes, strict=True):
                ms = [c * self.cfg.timestamp_segment_ms for c in part.tolist()]
                results[prepared.index] = word_spans(prepared.words, repaired(ms))
        return results

    def marker_logits(self, items: list[AlignItem]) -> list[torch.Tensor]:
        """The head's logits at the `<timestamp>` markers `[2 * units, classify_num]` (float32, CPU) of each
        item that can be aligned: what `align_batch` reads its classes from."""
        _, batch = self._prepare(items)
        with self._on_device():
            ids, markers, features, frames = self._inputs(batch)
            logits = self.module.thinker(ids.to(self.device), features, frames, markers.to(self.device))
            return list(logits.float().cpu().split(markers.sum(dim=1).tolist()))

    def marker_classes(self, items: list[AlignItem]) -> list[torch.Tensor]:
        """The timing class at each `<timestamp>` marker `[2 * units]` (CPU) of each item that can be aligned,
        through the forward `align_batch` uses (replayed from a graph, or eager)."""
        _, batch = self._prepare(items)
        with self._on_device():
            return self._classes(batch)

    @contextlib.contextmanager
    def _on_device(self):
        """Inference on the aligner's own stream, outside any graph capture (CUDA); plain inference (CPU)."""
        with torch.inference_mode(), torch.cuda.stream(self._stream), \
                CAPTURE_LOCK if self._stream is not None else contextlib.nullcontext():
            yield

    def _prepare(self, items: list[AlignItem]) -> tuple[list, list[_Prepared]]:
        """Results of the items that need no forward (nothing to say, or no audio to align), and the rest."""
        results: list[Spans | AlignmentFailed] = [[] for _ in items]
        batch = []
        for index, (pcm, rate, words) in enumerate(items):
            if not any(units(word) for word in words):
                results[index] = [(0.0, 0.0)] * len(words)
                continue
            clip = np.asarray(pcm, np.float32)
            if resampled_length(len(clip), rate, self.cfg.features.sampling_rate) < self.cfg.features.n_fft:
                results[index] = AlignmentFailed("the audio is too short to align")
            elif float(np.max(np.abs(clip))) < _SILENT_PEAK:
                results[index] = AlignmentFailed("the audio is silent")
            else:
                batch.append(_Prepared(index, clip, rate, words))
        return results, batch

    def _inputs(self, batch: list[_Prepared]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """The batch's right-padded prompts `[B, T]` and where their `<timestamp>` markers are (CPU), its
        features (device) and each clip's valid frames."""
        features, frames = log_mel_batch([p.clip for p in batch], self.cfg.features, self.device,
                                          [p.rate for p in batch])
        chunk = 2 * self.cfg.audio.n_window
        prompts = []
        for prepared, count in zip(batch, frames, strict=True):
            text = [i for w in prepared.words for u in units(w) for i in self._unit_ids(u)]
            prompts.append([self._start] + [self._pad] * encoded_length(count, chunk) + [self._end] + text)
        ids = torch.zeros(len(batch), max(len(p) for p in prompts), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt)
        return ids, ids == self.cfg.timestamp_token_id, features, frames

    def _classes(self, batch: list[_Prepared]) -> list[torch.Tensor]:
        """Each item's timing class at each of its markers (CPU)."""
        ids, markers, features, frames = self._inputs(batch)
        counts = markers.sum(dim=1).tolist()
        if self.graphed is not None and (every := self.graphed.classes(ids, features, frames)) is not None:
            return list(every[markers].split(counts))
        logits = self.module.thinker(ids.to(self.device), features, frames, markers.to(self.device))
        return list(logits.argmax(dim=-1).cpu().split(counts))

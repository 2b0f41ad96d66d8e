"""The aligner's forward as CUDA graphs: one per bucket of batch shape, captured when first needed.

Run eagerly, an alignment launches about 4,700 small kernels through 24 audio and 28 text layers, and on an
H100 it took 46 ms for one clause and 54 ms for sixteen: launches, not arithmetic, set its time, and each
launch holds the interpreter lock the engine's own thread needs. A graph replays the whole forward in one call
(16.7 ms for sixteen clauses; 8.6 ms with the text layers fused). A batch is padded up to its bucket: the
clips to a power of two, the longest clip to whole audio chunks (1 s each), the longest prompt to a multiple
of `LEN_STEP`. Padding rows and positions change no real row's result (see
`Thinker.forward_padded`). Once `MAX_GRAPHS` are held, a batch of a new bucket is padded further, to the
smallest held bucket that holds it (`MAX_COVER`); batches no bucket takes run eagerly.

Graphs are captured on the aligner's thread while the engine's thread keeps running, so the capture
forbids only its own thread's unsafe calls (`thread_local`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from streamvox.models.alignment.qwen3_aligner.audio_encoder import conv_length
from streamvox.models.alignment.qwen3_aligner.model import Thinker
from streamvox.models.qwen3_tts.kernels.graphs import capture_graph, copy_from_host

log = logging.getLogger(__name__)

MAX_CLIPS = 16  # clips in a graph's batch
LEN_STEP = 32  # prompt lengths are padded to a multiple of this
MAX_LEN = 1024  # the longest prompt a graph takes
MAX_WINDOWS = 4  # the longest clip a graph takes, in attention windows (8 s each)
MAX_GRAPHS = 64  # graphs held; all share one memory pool
MAX_COVER = 4  # once they are held, a batch may replay a bucket of up to this many times its own bucket's work


@dataclass(frozen=True)
class Bucket:
    clips: int  # rows
    chunks: int  # audio chunks per row
    length: int  # prompt positions per row


def bucket_for(clips: int, frames: int, length: int, chunk: int, per_window: int) -> Bucket | None:
    """The bucket of a batch of `clips` clips whose longest has `frames` mel frames and longest prompt
    `length` tokens (`chunk` frames a chunk, `per_window` chunks an attention window); None: no graph."""
    chunks = -(-frames // chunk)
    if clips > MAX_CLIPS or length > MAX_LEN or chunks > MAX_WINDOWS * per_window:
        return None
    return Bucket(1 << (clips - 1).bit_length(), chunks, -(-length // LEN_STEP) * LEN_STEP)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: run the forward directly (CPU)
    ids: torch.Tensor  # [clips, length]
    features: torch.Tensor  # [clips, n_mels, chunks * chunk]
    frames: torch.Tensor  # [clips]
    classes: torch.Tensor | None  # [clips, length]: the output


class GraphedForward:
    """`Thinker.forward_padded` and the argmax over timing classes, per bucket: replayed from a CUDA graph
    (`capture`), or run directly on the padded batch (the CPU, where it serves to test the padding)."""

    def __init__(self, thinker: Thinker, capture: bool) -> None:
        self._thinker = thinker
        cfg = thinker.cfg.audio
        self._chunk = 2 * cfg.n_window
        self._positions = conv_length(self._chunk)  # audio positions a chunk makes
        self._per_window = cfg.n_window_infer // self._chunk
        self._mels = cfg.num_mel_bins
        self._device = next(thinker.parameters()).device
        self._graphs: dict[Bucket, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._failed = False  # a capture failed: no more are tried

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets met so far (captured, when capturing)."""
        return list(self._graphs)

    def classes(self, ids: torch.Tensor, features: torch.Tensor, frames: list[int]) -> torch.Tensor | None:
        """The timing class at every position `[B, T]` (CPU) of prompts `ids` `[B, T]` (CPU) with `features`
        `[B, n_mels, F]` (device) and each clip's valid frames; None when no bucket takes the batch."""
        rows, length = ids.shape
        bucket = bucket_for(rows, features.shape[2], length, self._chunk, self._per_window)
        if bucket is None:
            return None
        g = self._graphs.get(bucket)
        if g is None and not self._failed and len(self._graphs) < MAX_GRAPHS:
            g = self._captured(bucket)
        if g is None:  # none can be captured: the smallest held bucket that holds this one, padded further
            bucket = self._cover(bucket)
            if bucket is None:
                return None
            g = self._graphs[bucket]
        padded = torch.zeros(bucket.clips, bucket.length, dtype=torch.long)
        padded[:rows, :length] = ids
        copy_from_host(g.ids, padded)
        copy_from_host(g.frames, torch.tensor(frames + [0] * (bucket.clips - rows)))
        g.features.zero_()
        g.features[:rows, :, : features.shape[2]].copy_(features)
        if g.graph is None:
            g.classes = self._forward(g)
        else:
            g.graph.replay()
        return g.classes[:rows, :length].cpu()

    def _captured(self, bucket: Bucket) -> _Graph | None:
        """The bucket's graph, captured now and held (None: the capture failed, and no more are tried)."""
        started = time.perf_counter()
        try:
            g = self._buffers(bucket)
        except RuntimeError:  # the aligner still works eagerly: say why, once, and stop capturing
            log.exception("the word aligner's forward could not be captured as a CUDA graph; it runs eagerly")
            self._failed = True
            return None
        self._graphs[bucket] = g
        if g.graph is not None:  # a capture in serving delays the alignments waiting for it: say how long
            log.info("word aligner: graph of %d clips x %d chunks x %d positions captured in %.0f ms (%d held)",
                     bucket.clips, bucket.chunks, bucket.length, 1000 * (time.perf_counter() - started),
                     len(self._graphs))
        return g

    def _cover(self, bucket: Bucket) -> Bucket | None:
        """The held bucket of least work (rows x audio and prompt positions) with at least `bucket`'s clips, chunks
        and prompt length, if it has at most `MAX_COVER` times `bucket`'s work; else None. Padding changes no real
        row's result, and costs less than the eager forward's launches (on an H100 a batch of 16 clauses of 2-4 s took
        12.5 ms through a graph, one clause 46 ms eagerly)."""
        def work(b: Bucket) -> int:
            return b.clips * (b.chunks * self._positions + b.length)

        covers = [b for b in self._graphs if b.clips >= bucket.clips and b.chunks >= bucket.chunks
                  and b.length >= bucket.length and work(b) <= MAX_COVER * work(bucket)]
        return min(covers, key=work, default=None)

    def _forward(self, g: _Graph) -> torch.Tensor:
        return self._thinker.forward_padded(g.ids, g.features, g.frames).argmax(dim=-1)

    def _buffers(self, bucket: Bucket) -> _Graph:
        """The bucket's input buffers, and its graph captured over them (when capturing)."""
        g = _Graph(None, torch.zeros(bucket.clips, bucket.length, dtype=torch.long, device=self._device),
                   torch.zeros(bucket.clips, self._mels, bucket.chunks * self._chunk, device=self._device),
                   torch.zeros(bucket.clips, dtype=torch.long, device=self._device), None)
        if self._pool is not None:
            g.graph, g.classes = capture_graph(lambda: self._forward(g), self._pool, mode="thread_local")
        return g

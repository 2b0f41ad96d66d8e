"""The streaming codec decoder with its carried state in slot buffers, replayed as CUDA graphs.

`Code2Wav.decode_stream` stacks each request's carried tails (one per stateful layer, about 40) into a
batch on every call and launches the decoder's several hundred kernels from Python: about 12 ms of host
time per call whatever its size, more than the GPU needs for a first chunk. Here each stream owns a
*slot* of persistent tail buffers `[slots, ...]`, and a call is: copy the codes and a (frames, start,
slot) table into static buffers, replay the graph captured for the call's (rows, frames) bucket, read
its static output. The graph gathers its rows' tails (zeros for a fresh stream, `start == 0`), runs the
decoder and scatters the new tails back. Rows are padded to a bucket (padded rows use a scratch slot);
frames are padded to a bucket too: every layer is causal, so padding never reaches a real sample, and
each row's tails are taken at its own real end. Chunks longer than the largest bucket are decoded in
pieces, which is exact (the decoder streams exactly).

Lanes: each has its own static buffers, graphs, scratch slot and memory pool, so two lanes may run at
once on different CUDA streams (the runner decodes first chunks on its high-priority AR stream, lane 0,
and the rest on the decoder stream, lane 1). A stream's calls must stay in order: the runner puts only a
stream's first chunk on lane 0, and the decoder stream waits for the AR stream before each call.

On the CPU (or with graphs off) the same code runs eagerly: that is how CI tests it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
from streamvox.models.qwen3_tts.codec.decoder_layers import DecodeStep
from streamvox.models.qwen3_tts.kernels.graphs import capture_graph, copy_from_host

log = logging.getLogger(__name__)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A graph call's fixed cost in padded row-frames: on an H200 (1.7B decoder, fp32/TF32) a call costs about
# 3 ms + 0.07 ms per row + 0.065 ms per row-frame, so ~46 row-frames per call and ~1 per row.
CALL_COST_FRAMES = 46


def frame_buckets(max_frames: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 4 frames below `max_frames`, then `max_frames` (1, 2, 4, 8, 12, 16, 20, 24, 25
    for 25): the chunk schedule's sizes (1, 2, 4, 8, 16, then the largest), and a request's last chunk,
    which can be any size, padded by at most 3 frames past 8."""
    out, n = [], 1
    while n < max_frames:
        out.append(n)
        n += n if n < 8 else 4
    return (*out, max_frames)


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    return next(b for b in buckets if b >= n)


@dataclass(eq=False)
class SlotStream:
    """One request's decoder stream: its tail slot and the frames decoded so far."""

    slot: int
    frames: int = 0


@dataclass(eq=False)
class _Lane:
    scratch: int  # slot written by padded rows
    codes: torch.Tensor  # [rows, G, frames] static input
    meta: torch.Tensor  # [3, rows]: real frames, start frame, slot of each row
    frame_buckets: tuple[int, ...]
    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = field(default_factory=dict)
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    pool: Any = None  # CUDA graph memory pool of its graphs
    stream: torch.cuda.Stream | None = None  # the CUDA stream of its last call
    calls: int = 0  # since `usage` last read them: graph calls, real and padded (rows x frames) frames
    frames: int = 0
    padded: int = 0


class GraphedDecoder:
    """`StreamingCodec` over a `Code2Wav`: per-slot tails, one graph per (lane, rows, frames) bucket."""

    def __init__(self, codec: Code2Wav, slots: int, max_rows: int, lane_frames: tuple[int, ...],
                 use_graphs: bool | None = None) -> None:
        """`slots`: streams at once; `max_rows`: rows per graph; `lane_frames[i]`: the largest chunk lane i
        takes in one graph (longer ones are decoded in pieces)."""
        self.codec = codec
        self.decoder = codec.decoder
        w = codec.decoder.pre_conv.conv.weight
        self.device, self.dtype = w.device, w.dtype
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.max_rows = max_rows
        self.row_buckets = (*(b for b in ROW_BUCKETS if b < max_rows), max_rows)
        self.spf = codec.samples_per_frame
        q = codec.num_quantizers
        self.tails = {name: torch.zeros((slots + len(lane_frames), *shape), dtype=self.dtype, device=self.device)
                      for name, shape in self._tail_shapes().items()}
        self.free = list(range(slots))
        self.releasing: list[tuple[list[torch.cuda.Event], int]] = []
        self.lanes = [
            _Lane(scratch=slots + i, codes=torch.zeros(max_rows, q, f, dtype=torch.long, device=self.device),
                  meta=torch.zeros(3, max_rows, dtype=torch.long, device=self.device), frame_buckets=frame_buckets(f),
                  pool=torch.cuda.graph_pool_handle() if self.use_graphs else None)
            for i, f in enumerate(lane_frames)
        ]
        for lane in self.lanes:
            lane.meta[2] = lane.scratch

    @property
    def sample_rate(self) -> int:
        return self.codec.sample_rate

    @property
    def samples_per_frame(self) -> int:
        return self.spf

    def _tail_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each stateful layer's tail shape (without the batch dimension), from a one-frame decode."""
        codes = torch.zeros(1, self.codec.num_quantizers, 1, dtype=torch.long, device=self.device)
        one = torch.ones(1, dtype=torch.long, device=self.device)
        step = DecodeStep(frames=one, rows_full=True, start=one * 0, tails_in={}, keep_state=True)
        with torch.inference_mode():
            self.decoder(codes, step)
        return {name: tuple(t.shape[1:]) for name, t in step.tails_out.items()}

    # ------------------------------------------------------------------ streams (slots)

    def new_stream_state(self) -> SlotStream:
        if not self.free:
            self._collect_released(wait=True)
        return SlotStream(self.free.pop(0))

    def release_stream(self, state: SlotStream) -> None:
        """Give the stream's slot back once the decoder calls already queued for it have run."""
        events = []
        for lane in self.lanes:
            if lane.stream is not None:
                event = torch.cuda.Event()
                event.record(lane.stream)
                events.append(event)
        self.releasing.append((events, state.slot))
        self._collect_released(wait=False)

    def _collect_released(self, wait: bool) -> None:
        still = []
        for events, slot in self.releasing:
            if wait and not self.free:
                for e in events:
                    e.synchronize()
            if all(e.query() for e in events):
                self.free.append(slot)
            else:
                still.append((events, slot))
        self.releasing = still
        self.free.sort()

    # ------------------------------------------------------------------ decoding

    def lane_frames(self, lane: int) -> int:
        return self.lanes[lane].frame_buckets[-1]

    @torch.inference_mode()
    def decode_stream(self, codes_list: list[torch.Tensor], states: list[SlotStream],
                      lane: int = -1) -> list[torch.Tensor]:
        """Decode the next frames of several streams (codes_list[i]: `[G, t_i]`); returns each one's
        new samples `[t_i * samples_per_frame]`. Runs on lane `lane` (default: the last)."""
        ln = self.lanes[lane]
        if self.device.type == "cuda":
            ln.stream = torch.cuda.current_stream()
        outs: list[list[torch.Tensor]] = [[] for _ in states]
        done = [0] * len(states)
        limit = ln.frame_buckets[-1]
        several = max((c.shape[1] for c in codes_list), default=0) > limit
        while True:
            rows = [i for i, c in enumerate(codes_list) if c.shape[1] > done[i]]
            if not rows:
                break
            pieces = [codes_list[i][:, done[i] : done[i] + limit] for i in rows]
            groups = self._partition([p.shape[1] for p in pieces], ln.frame_buckets)
            # Several calls may replay one graph twice: keep copies, not views of its static output.
            several = several or len(groups) > 1
            for group in groups:
                wavs = self._call(ln, [pieces[k] for k in group], [states[rows[k]] for k in group])
                for k, wav in zip(group, wavs, strict=True):
                    done[rows[k]] += pieces[k].shape[1]
                    outs[rows[k]].append(wav.clone() if several else wav)
        empty = torch.zeros(0, dtype=self.dtype, device=self.device)
        return [o[0] if len(o) == 1 else torch.cat(o) if o else empty for o in outs]

    def _partition(self, lens: list[int], frame_buckets: tuple[int, ...]) -> list[list[int]]:
        """Split rows of `lens` frames into graph calls: runs of the rows sorted by length (longest first)
        that minimise the padded work, (rows bucket) x (frames bucket + 1) summed over calls, plus
        CALL_COST_FRAMES per call. One call for everything would pad a 2-frame chunk to 25 frames and 9
        rows to 16 whenever chunks of different sizes fall due together (about half the decoder's work
        was padding at 64 streams); a call per size would pay each call's fixed cost."""
        order = sorted(range(len(lens)), key=lambda k: -lens[k])
        n = len(order)
        width = [_bucket(lens[k], frame_buckets) + 1 for k in order]  # a call starting at row j pads to width[j]
        padded_rows = [0] + [_bucket(r, self.row_buckets) for r in range(1, self.max_rows + 1)]
        best = [0.0] + [math.inf] * n  # best[i]: the least cost of the first i rows of `order`
        cut = [0] * (n + 1)  # the last call of best[i] starts at row cut[i]
        for i in range(1, n + 1):
            for j in range(max(0, i - self.max_rows), i):
                cost = best[j] + padded_rows[i - j] * width[j] + CALL_COST_FRAMES
                if cost < best[i]:
                    best[i], cut[i] = cost, j
        groups = []
        while n:
            groups.append(order[cut[n] : n])
            n = cut[n]
        return groups[::-1]

    def _call(self, ln: _Lane, pieces: list[torch.Tensor], states: list[SlotStream]) -> list[torch.Tensor]:
        """One graph replay (or eager run) for at most `max_rows` rows of at most the lane's frames."""
        n = len(pieces)
        lens = [p.shape[1] for p in pieces]
        rows, t = _bucket(n, self.row_buckets), _bucket(max(lens), ln.frame_buckets)
        key = (rows, t)
        if self.use_graphs and key not in ln.graphs:
            self._capture(ln, rows, t)
        if all(x == lens[0] for x in lens):
            ln.codes[:n, :, : lens[0]].copy_(torch.stack(pieces))
        else:
            for r, p in enumerate(pieces):
                ln.codes[r, :, : lens[r]].copy_(p)
        ln.calls, ln.frames, ln.padded = ln.calls + 1, ln.frames + sum(lens), ln.padded + rows * t
        pad = rows - n
        meta = torch.tensor([lens + [1] * pad, [s.frames for s in states] + [0] * pad,
                             [s.slot for s in states] + [ln.scratch] * pad], dtype=torch.long)
        copy_from_host(ln.meta[:, :rows], meta)
        if self.use_graphs:
            ln.graphs[key].replay()
            wav = ln.outputs[key]
        else:
            wav = self._forward(ln, rows, t)
        for s, m in zip(states, lens, strict=True):
            s.frames += m
        return [wav[r, : lens[r] * self.spf] for r in range(n)]

    def usage(self) -> str:
        """Calls and frames (real / padded) per lane since the last `usage`; resets them."""
        out = []
        for i, ln in enumerate(self.lanes):
            out.append(f"decoder lane {i}: {ln.calls} calls, {ln.frames} frames ({ln.padded} padded)")
            ln.calls = ln.frames = ln.padded = 0
        return ", ".join(out)

    def _forward(self, ln: _Lane, rows: int, t: int) -> torch.Tensor:
        """Gather the rows' tails (zeros for fresh streams), decode, scatter the new tails back."""
        frames, start, slot = ln.meta[0, :rows], ln.meta[1, :rows], ln.meta[2, :rows]
        fresh = start == 0
        tails_in: dict[str, torch.Tensor | None] = {}
        for name, buf in self.tails.items():
            rows_tail = buf.index_select(0, slot)
            tails_in[name] = rows_tail.masked_fill(fresh.view(-1, *([1] * (buf.dim() - 1))), 0)
        step = DecodeStep(frames=frames, rows_full=False, start=start, tails_in=tails_in, keep_state=True)
        wav = self.decoder(ln.codes[:rows, :, :t].clamp(min=0), step)
        for name, new in step.tails_out.items():
            self.tails[name].index_copy_(0, slot, new)
        return wav

    def _capture(self, ln: _Lane, rows: int, t: int) -> None:
        """Capture the (rows, t) graph of a lane: warm up on a side stream with every row on the
        scratch slot (so no stream's tails move), then capture."""
        ln.meta[0, :rows] = 1
        ln.meta[1, :rows] = 0
        ln.meta[2, :rows] = ln.scratch
        ln.graphs[(rows, t)], ln.outputs[(rows, t)] = capture_graph(lambda: self._forward(ln, rows, t), ln.pool)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Capture every lane's graphs (at load, so no request waits for a capture)."""
        if not self.use_graphs:
            return
        for ln in self.lanes:
            for rows in self.row_buckets:
                for t in ln.frame_buckets:
                    if (rows, t) not in ln.graphs:
                        self._capture(ln, rows, t)
        torch.cuda.synchronize()
        log.info("codec decoder graphs captured: %s", {i: len(ln.graphs) for i, ln in enumerate(self.lanes)})

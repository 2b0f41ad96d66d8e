"""Slot-indexed frame step for the Qwen3-TTS talker + code predictor, captured as CUDA graphs.

One call of `FrameStepper.step(n_rows, width)` advances every *active* slot in `[0, n_rows)` by one
codec frame, entirely on the device:

1. the code predictor fills codebooks 1..G-1 of the frame from the slot's last talker hidden state
   and its pending codebook-0 id (15 greedy steps over a fresh 17-position cache);
2. the talker consumes the frame's summed codebook embeddings plus the slot's text-track embedding
   and attends over its KV-cache slot (keys `[0, width)`, masked to each slot's own length);
3. the next codebook-0 id is chosen greedily after the repetition penalty and the suppress / minimum
   length masks, exactly as `Qwen3TTSRunner._choose` does.

Rows are KV-cache slots, so the batch needs no gather: the runner keeps busy slots low and pads the
row count to a bucket; inactive rows (free slots, or requests waiting for text) compute garbage that
is never committed (`torch.where(active, new, old)`), except a KV write at their own current
position, which a real step later overwrites. All inputs live in persistent buffers, so on CUDA each
`(n_rows, width)` bucket is captured once as a graph and replayed; on the CPU the same code runs
eagerly (that is how CI tests this path). The step never synchronises with the host: the runner reads
the chosen ids back asynchronously, one step late, to notice end-of-speech.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from streamvox.models.qwen3_tts.modeling import DenseCache

ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
WIDTH_STEP = 256  # talker attention width buckets: multiples of this


def row_bucket(n: int, max_rows: int) -> int:
    for b in ROW_BUCKETS:
        if b >= n:
            return min(b, max_rows)
    return max_rows


def width_bucket(n: int, max_len: int) -> int:
    w = -(-n // WIDTH_STEP) * WIDTH_STEP
    return min(max(w, WIDTH_STEP), max_len)


class _SlotView:
    """KV view over slots `[0, rows)`: one new position per row at `pos[row]`; attend to `[0, width)`."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, rows: int, width: int, ar_rows: torch.Tensor,
                 pos: torch.Tensor) -> None:
        self.k, self.v, self.rows, self.width, self.ar, self.pos = k, v, rows, width, ar_rows, pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k[layer, self.ar, :, self.pos] = k[:, :, 0]
        self.v[layer, self.ar, :, self.pos] = v[:, :, 0]
        return self.k[layer, : self.rows, :, : self.width], self.v[layer, : self.rows, :, : self.width]


class FrameStepper:
    """Per-slot device state and the greedy frame step (see module docstring)."""

    def __init__(self, model, cache, suppress: torch.Tensor, eos: int, min_new_tokens: int,
                 use_graphs: bool | None = None) -> None:
        self.model = model
        self.talker = model.talker
        self.cache = cache
        dev = model.device
        self.device = dev
        slots = cache.k.shape[1]
        self.slots = slots
        tc = model.cfg.talker
        self.groups = tc.num_code_groups
        h = tc.hidden_size
        v = tc.vocab_size
        self.eos = eos
        self.min_new = min_new_tokens
        if use_graphs is None:
            use_graphs = dev.type == "cuda" and os.environ.get("STREAMVOX_CUDA_GRAPHS", "1") != "0"
        self.use_graphs = use_graphs
        # persistent state (index = slot)
        self.hidden = torch.zeros(slots, h, dtype=model.dtype, device=dev)
        self.token = torch.zeros(slots, dtype=torch.long, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.count = torch.zeros(slots, dtype=torch.long, device=dev)  # codebook-0 ids chosen so far
        self.seen = torch.zeros(slots, v, dtype=torch.bool, device=dev)
        self.penalty = torch.ones(slots, dtype=torch.float32, device=dev)
        # per-step inputs, written by the host (one async copy)
        self.active = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.text_ids = torch.zeros(slots, dtype=torch.long, device=dev)
        # outputs
        self.frames = torch.zeros(slots, self.groups, dtype=torch.long, device=dev)
        self.suppress = suppress
        self.eos_mask = torch.zeros(v, dtype=torch.bool, device=dev)
        self.eos_mask[eos] = True
        self.ar = torch.arange(max(slots, self.groups + 1), device=dev)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None
        self._pinned: torch.Tensor | None = None

    # ------------------------------------------------------------------ host-side helpers (no sync)

    def set_inputs(self, active: list[bool], text_ids: list[int], rows: int) -> None:
        """Write this step's `active` and `text_ids` for rows `[0, rows)` with one non-blocking copy."""
        host = torch.tensor([int(a) for a in active] + list(text_ids), dtype=torch.long)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True)
        self.active[:rows].copy_(dev[:rows].bool())
        self.text_ids[:rows].copy_(dev[rows:])

    def reset_slot(self, slot: int, penalty: float) -> None:
        self.pos[slot] = 0
        self.count[slot] = 0
        self.seen[slot].zero_()
        self.penalty[slot] = penalty

    def prefill_done(self, slot: int, length: int, hidden: torch.Tensor) -> None:
        """After the prompt of `length` positions: store the last hidden state and choose codebook 0."""
        self.pos[slot] = length
        self.hidden[slot] = hidden
        logits = self.talker.codec_head(hidden)[None].float()
        s = slice(slot, slot + 1)
        tok = self._choose(logits, s)
        self.token[s] = tok
        self._record(tok, s, torch.ones(1, dtype=torch.bool, device=self.device))

    # ------------------------------------------------------------------ the step

    def _choose(self, logits: torch.Tensor, s: slice) -> torch.Tensor:
        pen = self.penalty[s, None]
        penalised = torch.where(logits < 0, logits * pen, logits / pen)
        logits = torch.where(self.seen[s], penalised, logits)
        mask = self.suppress[None] | (self.eos_mask[None] & (self.count[s] < self.min_new)[:, None])
        return logits.masked_fill(mask, float("-inf")).argmax(-1)

    def _record(self, tok: torch.Tensor, s: slice, active: torch.Tensor) -> None:
        seen = self.seen[s]
        old = seen.gather(1, tok[:, None])
        seen.scatter_(1, tok[:, None], old | active[:, None])
        self.count[s] += active.long()

    def _forward(self, rows: int, width: int) -> None:
        talker = self.talker
        cp = talker.code_predictor
        s = slice(0, rows)
        active = self.active[s]
        first = self.token[s]
        hidden = self.hidden[s]
        # code predictor: codebooks 1..G-1
        x = torch.stack([hidden, talker.model.codec_embedding(first)], dim=1)
        cache = DenseCache()
        codes = [first]
        pos = self.ar[:2][None].expand(rows, -1)
        for j in range(self.groups - 1):
            h = cp.model.run(cp.small_to_mtp_projection(x), pos, cache)
            tok = cp.lm_head[j](h[:, -1]).float().argmax(-1)
            codes.append(tok)
            if j + 1 < self.groups - 1:
                x = cp.model.codec_embedding[j](tok)[:, None]
                pos = (self.ar[j + 2 : j + 3])[None].expand(rows, -1)
        frames = torch.stack(codes, dim=1)
        self.frames[s] = frames
        # talker: one position per row
        x = talker.frame_embed(frames) + talker.text_embed(self.text_ids[s])
        p = self.pos[s]
        view = _SlotView(self.cache.k, self.cache.v, rows, width, self.ar[s], p)
        ar_w = torch.arange(width, device=self.device)
        mask = (ar_w[None, :] <= p[:, None])[:, None, None, :]
        h = talker.model.run(x[:, None], p[:, None], view, mask)[:, 0]
        logits = talker.codec_head(h).float()
        tok = self._choose(logits, s)
        self.token[s] = torch.where(active, tok, first)
        self.hidden[s] = torch.where(active[:, None], h, hidden)
        self._record(tok, s, active)
        self.pos[s] += active.long()

    def step(self, rows: int, width: int) -> None:
        """Advance the active slots in `[0, rows)` one frame (results in `frames`, `token`)."""
        if not self.use_graphs:
            self._forward(rows, width)
            return
        key = (rows, width)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(rows, width)
        graph.replay()

    def _capture(self, rows: int, width: int) -> torch.cuda.CUDAGraph:
        # Warm up on a side stream (lazy inits, cuBLAS workspaces), on a copy of the state so the
        # captured step does not advance anything; then capture and restore.
        saved = [t.clone() for t in (self.hidden, self.token, self.pos, self.count, self.seen)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        active_saved = self.active.clone()
        self.active.zero_()  # inactive rows commit nothing (only their KV position gets a write)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(rows, width)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            self._forward(rows, width)
        for t, old in zip((self.hidden, self.token, self.pos, self.count, self.seen), saved, strict=True):
            t.copy_(old)
        self.active.copy_(active_saved)
        self.graphs[(rows, width)] = graph
        return graph

    def warmup(self, max_rows: int, widths: tuple[int, ...]) -> None:
        """Capture the graphs for every row bucket up to `max_rows` at the given widths (at load)."""
        if not self.use_graphs:
            return
        for w in widths:
            for b in ROW_BUCKETS:
                if b > max_rows:
                    break
                if (b, w) not in self.graphs:
                    self._capture(b, w)
        torch.cuda.synchronize()


def sdpa_gqa_supported() -> bool:
    return "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

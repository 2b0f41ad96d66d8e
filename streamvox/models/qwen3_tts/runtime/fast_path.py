"""Slot-indexed frame step for the Qwen3-TTS talker + code predictor, captured as CUDA graphs.

One call of `FrameStepper.step(n_rows, width)` advances every *active* slot in `[0, n_rows)` by one
codec frame, entirely on the device:

1. the code predictor fills codebooks 1..G-1 of the frame from the slot's last talker hidden state
   and its pending codebook-0 id (15 steps over a fresh 17-position cache);
2. the talker consumes the frame's summed codebook embeddings plus the slot's text-track embedding
   and attends over its KV-cache slot (keys `[0, width)`, masked to each slot's own length);
3. the next codebook-0 id is chosen after the repetition penalty and the suppress / minimum length masks,
   as `EagerPath.choose` does (`runtime/eager.py`).

Each choice is an argmax: of the scores themselves for greedy rows, exactly as the eager path, and for sampled
rows of the warped scores plus Gumbel noise (`fast_sampling`). A step with any sampled row runs the sampled
variant of the step (its own graphs), which samples without host syncs; greedy rows in it choose as before.

Rows are KV-cache slots, so the batch needs no gather: the runner keeps busy slots low and pads the
row count to a bucket; inactive rows (free slots, or requests waiting for text) compute garbage that
is never committed (`torch.where(active, new, old)`), except a KV write at their own current
position, which a real step later overwrites. All inputs live in persistent buffers, so on CUDA each
`(n_rows, width)` bucket is captured once as a graph and replayed; on the CPU the same code runs
eagerly (that is how CI tests this path). The step never synchronises with the host: the runner reads
the chosen ids back asynchronously, one step late, to notice end-of-speech.

Hundreds of small dependent kernels, not the bytes they read, bound this step: the 15 sequential
predictor passes are most of it. The step runs each layer as five Triton launches (`FusedStack.layer_rows`;
the talker's attention as `split_attend` up to `Qwen3Settings.split_attend_max_rows` rows, else a cache write
and SDPA), and the predictor's passes as such launches only (`_predict_rows`); at one row, the one-launch CUDA
kernels (`kernels/predictor.py`, `kernels/talker.py`) take the predictor's passes and the talker's layers where
they can (the one-launch predictor kernel picks greedily: sampled steps keep the per-layer launches). Without
the Triton kernels (switched off, or above `Qwen3Settings.kernel_max_rows` rows), and in
prefill, each layer runs as two fused torch halves (`runtime/fused_stack.py`).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from streamvox.models.qwen3_tts.kernels.graphs import capture_graph, copy_from_host
from streamvox.models.qwen3_tts.kernels.predictor import predictor_passes
from streamvox.models.qwen3_tts.kernels.talker import talker_layers
from streamvox.models.qwen3_tts.runtime.fast_sampling import PREDICTOR, TALKER, SlotSampling
from streamvox.models.qwen3_tts.runtime.fused_stack import FusedStack, compiled_fns, decode_kernels
from streamvox.models.qwen3_tts.sampling import SamplerSettings
from streamvox.settings import Qwen3Settings

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
WIDTH_STEP = 256  # talker attention width buckets: multiples of this
PREFILL_LEN_STEP = 64  # prefill graph lengths: multiples of this, up to PREFILL_MAX_LEN (longer: eager)
PREFILL_MAX_LEN = 512
PREFILL_MAX_TOKENS = 16384  # prefill graphs captured at load: rows x length at most this


def row_bucket(n: int, max_rows: int) -> int:
    for b in ROW_BUCKETS:
        if b >= n:
            return min(b, max_rows)
    return max_rows


def width_bucket(n: int, max_len: int) -> int:
    w = -(-n // WIDTH_STEP) * WIDTH_STEP
    return min(max(w, WIDTH_STEP), max_len)


class FrameStepper:
    """Per-slot device state and the frame step (see module docstring). `use_graphs` and `use_kernels`
    override `settings` (`cuda_graphs` on CUDA; `kernels`)."""

    def __init__(self, model, cache, suppress: torch.Tensor, eos: int, min_new_tokens: int,
                 use_graphs: bool | None = None, use_kernels: bool | None = None,
                 settings: Qwen3Settings | None = None) -> None:
        settings = settings or Qwen3Settings()
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
            use_graphs = dev.type == "cuda" and settings.cuda_graphs
        self.use_graphs = use_graphs
        use_compile = settings.compile == "1" or (settings.compile == "auto" and dev.type == "cuda")
        fns = compiled_fns(use_compile)
        kernels = decode_kernels(dev, use_kernels, settings.kernels)
        # Frame steps of at most this many rows use the Triton decode kernels (default: all; H200, 1.7B, graph of
        # one step, session 9: 3.85 vs 7.16 ms for the torch layers at 1 row, 4.94 vs 7.71 at 16, and 6.67 vs 8.33
        # at 64, where the GEMMs are cuBLAS calls between the kernels)
        self.kernel_max_rows = settings.kernel_max_rows
        # Frame steps of at most this many rows attend in the talker with `split_attend` (one launch) instead of
        # a cache write and SDPA (default 16; H200, 1.7B, graph of one step at width 256, session 11: 3.75 vs
        # 3.80 ms at 1 row, 4.41 vs 4.51 at 4, 4.86 vs 4.95 at 16, but 7.25 vs 6.65 at 64)
        self.split_attend_max_rows = settings.split_attend_max_rows
        self.tstack = FusedStack(self.talker.model, fns, kernels)
        self.pstack = FusedStack(self.talker.code_predictor.model, fns, kernels)
        self._row_index: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        pc = self.talker.code_predictor.cfg
        self.pk = torch.zeros(pc.num_hidden_layers, slots, pc.num_key_value_heads, self.groups + 1, pc.head_dim,
                              dtype=model.dtype, device=dev)
        self.pv = torch.zeros_like(self.pk)
        # one-row steps: the 14 single-position predictor passes in one launch (CUDA, the released shapes)
        self.pred_kernel = (predictor_passes(model, self.pstack, self.pk, self.pv, settings.predictor_kernel,
                                             settings.decoder_sms) if kernels is not None else None)
        # and the talker's layers in one launch (CUDA, the released 1.7B and 0.6B shapes)
        self.talk_kernel = (talker_layers(model, self.tstack, cache, settings.talker_kernel, settings.decoder_sms)
                            if kernels is not None else None)
        ppos = torch.arange(self.groups + 1, device=dev)[None]
        self.pcos, self.psin = self.talker.code_predictor.model.rotary(ppos, model.dtype)  # [1, G+1, hd]
        # persistent state (index = slot)
        self.hidden = torch.zeros(slots, h, dtype=model.dtype, device=dev)
        self.token = torch.zeros(slots, dtype=torch.long, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.count = torch.zeros(slots, dtype=torch.long, device=dev)  # codebook-0 ids chosen so far
        self.seen = torch.zeros(slots, v, dtype=torch.bool, device=dev)
        self.penalty = torch.ones(slots, dtype=torch.float32, device=dev)
        self.unit_penalty = torch.ones(slots, dtype=torch.float32, device=dev)  # sampled scores carry theirs
        self.sampling = SlotSampling(slots, dev, kernel=kernels is not None)
        # per-step inputs, written by the host (one async copy)
        self.active = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.text_ids = torch.zeros(slots, dtype=torch.long, device=dev)
        # outputs
        self.frames = torch.zeros(slots, self.groups, dtype=torch.long, device=dev)
        self.suppress = suppress
        self.eos_mask = torch.zeros(v, dtype=torch.bool, device=dev)
        self.eos_mask[eos] = True
        self.ar = torch.arange(max(slots, self.groups + 1), device=dev)
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}  # (rows, width, sampled)
        # batched prefill graphs (CUDA): static prompt buffer, rows x length buckets, the cache's last
        # slot as scratch for padded rows (the runner never hands it out)
        self.scratch = slots - 1
        self.prefill_rows = tuple(r for r in ROW_BUCKETS if r < slots - 1) + (slots - 1,)
        self.prefill_lens = PREFILL_MAX_LEN // PREFILL_LEN_STEP
        self.prefill_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.bucketed_prefill = use_graphs  # static, bucketed buffers (without graphs: for tests)
        self.pf_x = torch.zeros(self.prefill_rows[-1], PREFILL_MAX_LEN, h, dtype=model.dtype, device=dev)
        self.pf_meta = torch.zeros(2, self.prefill_rows[-1], dtype=torch.long, device=dev)
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None  # shared by all its graphs
        self._pinned: torch.Tensor | None = None

    @property
    def kernels(self) -> bool:
        """Whether frame steps of at most `kernel_max_rows` rows run the Triton decode kernels."""
        return self.tstack.kernels is not None

    # ------------------------------------------------------------------ host-side helpers (no sync)

    def set_inputs(self, active: list[bool], text_ids: list[int], rows: int) -> None:
        """Write this step's `active` and `text_ids` for rows `[0, rows)` with one non-blocking copy."""
        host = torch.tensor([int(a) for a in active] + list(text_ids), dtype=torch.long)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True)
        self.active[:rows].copy_(dev[:rows].bool())
        self.text_ids[:rows].copy_(dev[rows:])

    def reset_slot(self, slot: int, penalty: float, talker: SamplerSettings | None = None,
                   predictor: SamplerSettings | None = None, seed: int = 0) -> None:
        """Ready `slot` for a new request: its repetition penalty, and its stages' sampling (None: greedy)."""
        # fill_, not `t[slot] = 0`: assigning a Python number to a CUDA tensor element copies it from the
        # host and waits for all the work queued on the stream (the running frame steps)
        self.pos[slot].fill_(0)
        self.count[slot].fill_(0)
        self.seen[slot].zero_()
        self.penalty[slot].fill_(penalty)
        self.sampling.set_slot(slot, talker, predictor, seed)

    @torch.inference_mode()
    def prefill(self, slot: int, embeds: torch.Tensor) -> torch.Tensor:
        """Run a prompt `[n, H]` through the fused talker stack into KV slot `slot`; the last hidden state."""
        n = embeds.shape[0]
        ts = self.tstack
        kc, vc = self.cache.k, self.cache.v
        cos, sin = self.talker.model.rotary(torch.arange(n, device=self.device)[None], embeds.dtype)

        def attend(i, q, k, v):
            kc[i, slot, :, :n] = k[0]
            vc[i, slot, :, :n] = v[0]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=ts.gqa)

        h = embeds[None]
        for i in range(len(ts.layers)):
            h = ts.layer(i, h, cos, sin, attend)
        return ts.rms(h[0, -1], ts.norm_w, ts.norm_eps)

    @torch.inference_mode()
    def prefill_batch(self, slots: list[int], embeds: list[torch.Tensor]) -> None:
        """Several prompts (`[n_i, H]` each) in one forward over the fused talker stack, right-padded to
        the longest; each row's keys/values go to its KV slot and its last real position's hidden state
        chooses its first codebook-0 id (as `prefill` + `prefill_done`, for all rows at once).

        Causal attention keeps every real position blind to the padding after it; the padded positions'
        keys are written too, past each row's length, where the frame step masks them out until it
        overwrites them. Slots must be reset (`reset_slot`) first.

        With graphs, a batch that fits `prefill_rows` x `prefill_len` replays the graph of its
        (rows, length) bucket over static buffers; padded rows write to the scratch slot."""
        b = len(slots)
        lens = [int(e.shape[0]) for e in embeds]
        n = max(lens)
        if self.bucketed_prefill and b <= self.prefill_rows[-1] and n <= PREFILL_MAX_LEN:
            self._prefill_bucketed(slots, embeds, lens)
            return
        dev = self.device
        idx = torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True)
        last = torch.tensor([x - 1 for x in lens], dtype=torch.long).to(dev, non_blocking=True)
        if b == 1:
            x = embeds[0][None]
        else:
            x = embeds[0].new_zeros(b, n, embeds[0].shape[1])
            for i, e in enumerate(embeds):
                x[i, : e.shape[0]] = e
        self._prefill_forward(x, idx, last)

    def _prefill_bucketed(self, slots: list[int], embeds: list[torch.Tensor], lens: list[int]) -> None:
        b = len(slots)
        rows = next(r for r in self.prefill_rows if r >= b)
        width = -(-max(lens) // PREFILL_LEN_STEP) * PREFILL_LEN_STEP
        graph = None
        if self.use_graphs:
            graph = self.prefill_graphs.get((rows, width)) or self._capture_prefill(rows, width)
        if all(x == lens[0] for x in lens):
            self.pf_x[:b, : lens[0]].copy_(torch.stack(embeds))
        else:
            for i, e in enumerate(embeds):
                self.pf_x[i, : lens[i]].copy_(e)
        pad = rows - b
        meta = torch.tensor([list(slots) + [self.scratch] * pad, [x - 1 for x in lens] + [0] * pad],
                            dtype=torch.long)
        copy_from_host(self.pf_meta[:, :rows], meta)
        if graph is not None:
            graph.replay()
        else:
            self._prefill_forward(self.pf_x[:rows, :width], self.pf_meta[0, :rows], self.pf_meta[1, :rows])

    def _capture_prefill(self, rows: int, width: int) -> torch.cuda.CUDAGraph:
        """Capture the (rows, width) prefill graph; warm-up and capture write to the scratch slot only."""
        self.pf_meta[0, :rows] = self.scratch
        self.pf_meta[1, :rows] = width - 1
        x, idx, last = self.pf_x[:rows, :width], self.pf_meta[0, :rows], self.pf_meta[1, :rows]
        graph, _ = capture_graph(lambda: self._prefill_forward(x, idx, last), self.pool)
        self.prefill_graphs[(rows, width)] = graph
        return graph

    def _prefill_forward(self, x: torch.Tensor, idx: torch.Tensor, last: torch.Tensor) -> None:
        """The batched prefill's device work: prompts `x` `[b, n, H]` into KV slots `idx`, each row's
        hidden state at `last` choosing its first codebook-0 id."""
        b, n = x.shape[0], x.shape[1]
        ts = self.tstack
        kc, vc = self.cache.k, self.cache.v
        dev = self.device
        cos, sin = self.talker.model.rotary(torch.arange(n, device=dev)[None], x.dtype)

        def attend(i, q, k, v):
            kc[i, idx, :, :n] = k
            vc[i, idx, :, :n] = v
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=ts.gqa)

        h = x
        for i in range(len(ts.layers)):
            h = ts.layer(i, h, cos, sin, attend)
        h = ts.rms(h[torch.arange(b, device=dev), last], ts.norm_w, ts.norm_eps)  # [b, H]
        self.pos[idx] = last + 1
        self.hidden[idx] = h
        logits = self.talker.codec_head(h).float()
        tok = self._choose(logits, idx, sample=True)
        self.token[idx] = tok
        self.seen.index_put_((idx, tok), torch.ones_like(tok, dtype=torch.bool))  # fresh slots: one id each
        self.count[idx] += 1

    @torch.inference_mode()
    def prefill_done(self, slot: int, length: int, hidden: torch.Tensor) -> None:
        """After the prompt of `length` positions: store the last hidden state and choose codebook 0."""
        self.pos[slot].fill_(length)
        self.hidden[slot] = hidden
        logits = self.talker.codec_head(hidden)[None].float()
        s = slice(slot, slot + 1)
        tok = self._choose(logits, s, sample=True)
        self.token[s] = tok
        self._record(tok, s, torch.ones(1, dtype=torch.bool, device=self.device))

    # ------------------------------------------------------------------ the step

    def _choose(self, logits: torch.Tensor, s: slice | torch.Tensor, sample: bool = False) -> torch.Tensor:
        return self._scores(logits, s, sample).argmax(-1)

    def _scores(self, logits: torch.Tensor, s: slice | torch.Tensor, sample: bool) -> torch.Tensor:
        """Codebook-0 scores whose argmax is the choice: the repetition penalty and the masks, then with
        `sample` the sampled rows' warp and noise."""
        pen = self.penalty[s, None]
        penalised = torch.where(logits < 0, logits * pen, logits / pen)
        logits = torch.where(self.seen[s], penalised, logits)
        mask = self.suppress[None] | (self.eos_mask[None] & (self.count[s] < self.min_new)[:, None])
        logits = logits.masked_fill(mask, float("-inf"))
        if sample:
            logits = self.sampling.scores(logits, s, TALKER, self.count[s], 0)
        return logits

    def _record(self, tok: torch.Tensor, s: slice, active: torch.Tensor) -> None:
        seen = self.seen[s]
        old = seen.gather(1, tok[:, None])
        seen.scatter_(1, tok[:, None], old | active[:, None])
        self.count[s] += active.long()

    def _pick(self, scores: torch.Tensor, s: slice, codebook: int, sampled: bool) -> torch.Tensor:
        """The code predictor's scores `[rows, V]` (float32) for `codebook`, as scores whose argmax is the pick."""
        if not sampled:
            return scores
        return self.sampling.scores(scores, s, PREDICTOR, self.count[s], codebook)

    def _forward(self, rows: int, width: int, sampled: bool = False) -> None:
        talker = self.talker
        cp = talker.code_predictor
        s = slice(0, rows)
        active = self.active[s]
        first = self.token[s]
        hidden = self.hidden[s]
        # code predictor: codebooks 1..G-1, over a static (G+1)-position scratch cache
        embed = talker.model.codec_embedding(first)
        x = torch.stack([hidden, embed], dim=1)
        kernels = self.kernels and rows <= self.kernel_max_rows
        frames = self.frames[s]
        frames[:, 0] = first
        if kernels:
            self._predict_rows(x, frames, embed, sampled)  # embed: now the frame's embedding sum (frame_embed)
        else:
            start = 0
            for j in range(self.groups - 1):
                n = x.shape[1]
                scores = self._pred_pass(x, self.pk, self.pv, self.pcos[:, start:start + n],
                                         self.psin[:, start:start + n], start, cp.lm_head[j].weight, n > 1)
                frames[:, j + 1] = self._pick(scores, s, j + 1, sampled).argmax(-1)
                start += n
                if j + 1 < self.groups - 1:
                    x = cp.model.codec_embedding[j](frames[:, j + 1])[:, None]
            embed = talker.frame_embed(frames)
        # talker: one position per row
        x = embed + talker.text_embed(self.text_ids[s])
        p = self.pos[s]
        ts = self.tstack
        split = kernels and rows <= self.split_attend_max_rows
        if not split:
            ar_w = torch.arange(width, device=self.device)
            mask = (ar_w[None, :] <= p[:, None])[:, None, None, :]
        if kernels:
            slot = self.ar[s]
            if rows == 1 and self.talk_kernel is not None:  # the talker's layers in one launch
                h = self.talk_kernel(x.view(-1), p, slot)
            else:
                h = self._talker_rows(x, slot, p, width, None if split else mask)
            h = ts.rms(h, ts.norm_w, ts.norm_eps)
            logits = ts.kernels.linear(h, talker.codec_head.weight, out_dtype=torch.float32)
            penalty = self.penalty[s]
            if sampled:  # penalised, masked, warped and noised here: the kernel's penalty becomes a no-op
                logits, penalty = self._scores(logits, s, True), self.unit_penalty[s]
            ts.kernels.choose_commit(logits, h, penalty, self.seen[s], self.suppress, self.eos_mask, self.count[s],
                                     self.pos[s], active, self.token[s], self.hidden[s], self.min_new)
            return
        kc, vc, rix = self.cache.k, self.cache.v, self.ar[s]

        def attend_t(i, q, k, v):
            kc[i, rix, :, p] = k[:, :, 0]
            vc[i, rix, :, p] = v[:, :, 0]
            return F.scaled_dot_product_attention(q, kc[i, :rows, :, :width], vc[i, :rows, :, :width],
                                                  attn_mask=mask, enable_gqa=ts.gqa)

        cos, sin = talker.model.rotary(p[:, None], x.dtype)
        h = x[:, None]
        for i in range(len(ts.layers)):
            h = ts.layer(i, h, cos, sin, attend_t)
        self._commit(ts.rms(h, ts.norm_w, ts.norm_eps)[:, 0], s, active, first, hidden, sampled)

    def _talker_rows(self, h: torch.Tensor, slot: torch.Tensor, p: torch.Tensor, width: int,
                     mask: torch.Tensor | None) -> torch.Tensor:
        """The talker's layers over one position per row with the Triton kernels: the attention by
        `split_attend`, or with `mask` given by SDPA over the cache's first `width` positions."""
        ts, rows = self.tstack, h.shape[0]
        for i in range(len(ts.layers)):
            kc, vc = self.cache.k[i], self.cache.v[i]
            if mask is None:  # split_attend: the cache write and the attention in one launch
                h = ts.layer_rows(i, h, slot, p, kc, vc, width=width)
                continue

            def attend(q, kc=kc, vc=vc):
                o = F.scaled_dot_product_attention(q[:, :, None], kc[:rows, :, :width], vc[:rows, :, :width],
                                                   attn_mask=mask, enable_gqa=ts.gqa)
                return o.reshape(rows, -1)

            h = ts.layer_rows(i, h, slot, p, kc, vc, attend)
        return h

    def _commit(self, h: torch.Tensor, s: slice, active: torch.Tensor, first: torch.Tensor, hidden: torch.Tensor,
                sampled: bool) -> None:
        """From the talker's final hidden states `h` `[rows, H]`: choose the next codebook-0 ids and
        advance the active rows (inactive rows keep `first` and `hidden`)."""
        tok = self._choose(self.talker.codec_head(h).float(), s, sampled)
        self.token[s] = torch.where(active, tok, first)
        self.hidden[s] = torch.where(active[:, None], h, hidden)
        self._record(tok, s, active)
        self.pos[s] += active.long()

    def _pred_pass(self, x, pk, pv, cos, sin, start: int, w_head, causal: bool):
        """One code-predictor pass: `x` `[rows, n, H_talker]` at positions `[start, start + n)` through
        the projection, the 5 layers (keys/values into the scratch cache `pk`/`pv`) and codebook head
        `w_head`; returns the head's scores `[rows, V]` (float32). (Compiling the whole pass measured slower on
        the H200 than the compiled layer halves it uses: frame step 7.3 vs 6.2 ms at batch 1.)"""
        ps = self.pstack
        rows, n = x.shape[0], x.shape[1]
        end = start + n
        h = self.talker.code_predictor.small_to_mtp_projection(x)
        for i, p in enumerate(ps.layers):
            q, k, v = ps.pre(h, p["w_ln"], p["w_qkv"], p["w_qn"], p["w_kn"], cos, sin, ps.eps, ps.nh, ps.nkv, ps.hd)
            pk[i, :rows, :, start:end] = k
            pv[i, :rows, :, start:end] = v
            a = F.scaled_dot_product_attention(q, pk[i, :rows, :, :end], pv[i, :rows, :, :end], is_causal=causal,
                                               enable_gqa=ps.gqa)
            h = ps.post(h, a, p["w_o"], p["w_ln2"], p["w_gu"], p["w_down"], ps.eps, ps.inter)
        h = ps.rms(h[:, -1], ps.norm_w, ps.norm_eps)
        return F.linear(h, w_head).float()

    def _predict_rows(self, x: torch.Tensor, frames: torch.Tensor, embed: torch.Tensor, sampled: bool) -> None:
        """`_pred_pass` x 15 with the Triton layers, from `x` `[rows, 2, H_talker]` (the talker's hidden
        state and codebook 0's embedding) into `frames[:, 1:]`, each chosen code's embedding added to
        `embed` `[rows, H_talker]` (codebook 0's), which ends as `frame_embed(frames)`. Each (request,
        position) is a row whose cache slot is its request's. Between passes one GEMM picks the id (the argmax
        of the head's scores, or in a sampled step of `_pick`'s), looks up its embedding and projects it, so the
        15 passes are Triton launches only (a projection other than a linear, as the 0.6B model's identity, is
        applied to the embedding that `select_rows` looks up)."""
        ps, dk = self.pstack, self.pstack.kernels
        cp = self.talker.code_predictor
        proj = cp.small_to_mtp_projection
        fused = isinstance(proj, torch.nn.Linear)
        rows = x.shape[0]
        h = x.reshape(rows * 2, -1)
        h = dk.linear(h, proj.weight, bias=proj.bias) if fused else proj(h)
        start, n = 0, 2
        for j in range(self.groups - 1):
            key = (rows, n, start)
            if key not in self._row_index:  # filled by the eager warm-up before a capture
                self._row_index[key] = (torch.arange(rows, device=self.device).repeat_interleave(n),
                                        torch.arange(start, start + n, device=self.device).repeat(rows))
            slot, pos = self._row_index[key]
            for i in range(len(ps.layers)):
                h = ps.layer_rows(i, h, slot, pos, self.pk[i], self.pv[i], one_per_slot=n == 1)
            last = h.view(rows, n, -1)[:, -1]
            scores = dk.linear(last, cp.lm_head[j].weight, norm=ps.norm_w, eps=ps.norm_eps, out_dtype=torch.float32)
            scores = self._pick(scores, slice(0, rows), j + 1, sampled)
            start, n = start + n, 1
            last_pass = j + 1 == self.groups - 1
            table = cp.model.codec_embedding[j].weight
            if fused and not last_pass:
                h = dk.linear(table, proj.weight, bias=proj.bias, select=scores, tokens=frames[:, j + 1], total=embed)
            else:
                e = dk.select_rows(scores, table, frames[:, j + 1], embed, embed=not last_pass)
                if not last_pass:
                    h = proj(e)
            if rows == 1 and self.pred_kernel is not None and not sampled:  # the other passes in one launch
                self.pred_kernel(h.view(-1), frames[0], embed[0])
                return

    @torch.inference_mode()
    def step(self, rows: int, width: int, sampled: bool = False) -> None:
        """Advance the active slots in `[0, rows)` one frame (results in `frames`, `token`); `sampled`: some
        active row samples (the step's sampled variant)."""
        if not self.use_graphs:
            self._forward(rows, width, sampled)
            return
        graph = self.graphs.get((rows, width, sampled))
        if graph is None:
            graph = self._capture(rows, width, sampled)
        graph.replay()

    def _capture(self, rows: int, width: int, sampled: bool) -> torch.cuda.CUDAGraph:
        # Warm up and capture on a copy of the state, so the captured step does not advance anything.
        saved = [t.clone() for t in (self.hidden, self.token, self.pos, self.count, self.seen)]
        active_saved = self.active.clone()
        self.active.zero_()  # inactive rows commit nothing (only their KV position gets a write)
        try:
            self._forward(rows, width, sampled)
        except Exception:  # a torch.compile or Triton failure: continue with plain torch layers
            log.exception("fused frame step failed; continuing with plain torch layers")
            self.tstack.kernels = self.pstack.kernels = self.sampling.kernel = None
            fns = compiled_fns(False)
            self.tstack.pre, self.tstack.post, self.tstack.rms = fns
            self.pstack.pre, self.pstack.post, self.pstack.rms = fns
        graph, _ = capture_graph(lambda: self._forward(rows, width, sampled), self.pool)
        for t, old in zip((self.hidden, self.token, self.pos, self.count, self.seen), saved, strict=True):
            t.copy_(old)
        self.active.copy_(active_saved)
        self.graphs[(rows, width, sampled)] = graph
        return graph

    @torch.inference_mode()
    def warmup(self, max_rows: int, widths: tuple[int, ...]) -> None:
        """Capture the frame-step graphs (greedy and sampled) for every row bucket up to `max_rows` at the given
        widths, and
        the prefill graphs of at most PREFILL_MAX_TOKENS positions (at load). No widths: nothing now (every
        graph is captured on first use)."""
        if not self.use_graphs or not widths:
            return
        for w in widths:
            for b in ROW_BUCKETS:
                if b > max_rows:
                    break
                for sampled in (False, True):
                    if (b, w, sampled) not in self.graphs:
                        self._capture(b, w, sampled)
        for rows in self.prefill_rows:
            for i in range(1, self.prefill_lens + 1):
                width = i * PREFILL_LEN_STEP
                if rows * width <= PREFILL_MAX_TOKENS and (rows, width) not in self.prefill_graphs:
                    self._capture_prefill(rows, width)
        torch.cuda.synchronize()


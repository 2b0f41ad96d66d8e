"""Continuous batching over the KV-cache slots: what each engine step runs.

Each step:
1. prefill: requests whose prompt can be built (enough text has arrived) get a free KV slot, first come,
   first served, run their prompt through the talker and pick their first codebook-0 id (on the fast path
   all of a step's prompts go through in few padded forwards);
2. frame step: every request whose next text-track item is known runs one frame: the code predictor fills
   codebooks 1..15, then the talker consumes the frame's summed embeddings plus the text track and picks the
   next codebook-0 id. A request still waiting for its next text token is skipped: it burns no pad;
3. audio: due chunks of buffered frames go to the codec decoder (`decode_pipeline`), and requests whose
   audio has all been sent finish.
"""

from __future__ import annotations

import time

import torch

from streamvox.contract import OutputSink, RequestError
from streamvox.models.qwen3_tts.model.prompt import PromptBuilder, prompt_ready
from streamvox.models.qwen3_tts.runtime.decode_pipeline import DecodePipeline
from streamvox.models.qwen3_tts.runtime.eager import EagerPath
from streamvox.models.qwen3_tts.runtime.fast_steps import FastSteps
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache
from streamvox.models.qwen3_tts.runtime.requests import Request
from streamvox.models.qwen3_tts.runtime.timing import StepTiming


class Scheduler:
    """Owns the live requests (`requests`, in admission order `order`) and the free KV slots. Requests take the
    fast path when there is one (`fast`, greedy and sampled alike), else the eager path. Fast-path prompts are
    prefilled together, at most `max_prefill_batch` prompts and `max_prefill_tokens` padded positions per forward."""

    def __init__(self, requests: dict[str, Request], prompts: PromptBuilder, cache: SlotCache, eager: EagerPath,
                 fast: FastSteps | None, pipeline: DecodePipeline, max_batch: int, max_prefill_batch: int,
                 max_prefill_tokens: int, timing: StepTiming | None) -> None:
        self.requests = requests
        self.order: list[str] = []  # admission order (prefill is first come, first served)
        self.free_slots = list(range(max_batch))
        self.prompts = prompts
        self.cache = cache
        self.eager = eager
        self.fast = fast
        self.pipeline = pipeline
        self.max_prefill_batch = max_prefill_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.timing = timing

    def add(self, req: Request) -> None:
        self.requests[req.rid] = req
        self.order.append(req.rid)

    def release(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        self.order.remove(request_id)
        if req.slot is not None:
            self.free_slots.append(req.slot)
            self.free_slots.sort()  # lowest slots first: the fast path's row count is the highest busy slot
            req.slot = None
        req.buffer.clear()
        self.pipeline.release(req)
        req.hidden = None

    def has_work(self) -> bool:
        if self.pipeline.inflight or (self.fast is not None and self.fast.pending is not None):
            return True
        for req in self.requests.values():
            if req.finish_reason is not None or req.buffer and self.pipeline.chunk_due(req):
                return True
            if req.slot is None:
                if self.free_slots and prompt_ready(req.spec, req.track, req.text_done):
                    return True
            elif req.generating and req.can_step():
                return True
        return False

    def step(self, sink: OutputSink) -> None:
        tm = self.timing
        t0 = time.perf_counter()
        ready: list[Request] = []
        for rid in list(self.order):
            if len(ready) >= len(self.free_slots):
                break
            req = self.requests.get(rid)
            if req is None or req.slot is not None or req.finish_reason is not None:
                continue
            if prompt_ready(req.spec, req.track, req.text_done):
                ready.append(req)
        if ready:
            self._prefill(ready, sink)
        t1 = time.perf_counter()
        batch = [r for r in (self.requests[i] for i in self.order) if r.generating and r.can_step()]
        slow = [r for r in batch if not r.fast]
        fast = [r for r in batch if r.fast]
        if slow:
            self.eager.step(slow)
        if self.fast is not None and (fast or self.fast.pending is not None):
            self.fast.step(fast, sink)
        t2 = time.perf_counter()
        self.pipeline.emit([self.requests[i] for i in self.order], sink, block=not batch)
        self._finish(sink)
        if tm is not None:
            t3 = time.perf_counter()
            tm.add("prefill", t1 - t0, len(ready))
            tm.add("decode", t2 - t1, len(batch))
            tm.add("emit", t3 - t2)
            tm.add("step", t3 - t0)  # last: it counts the step and logs each window

    def _prefill(self, ready: list[Request], sink: OutputSink) -> None:
        """Start the ready requests (first come, first served) in free slots and run their prompts.

        Fast-path prompts go through the talker together, in groups of at most
        `max_prefill_batch` prompts and `max_prefill_tokens` padded positions (one forward each), so a
        burst of arrivals costs one prefill rather than one per request; the others run one by one."""
        group: list[tuple[Request, torch.Tensor]] = []
        for req in ready:
            t0 = time.perf_counter()
            try:
                embeds = self._start(req)
                if self.timing is not None:
                    self.timing.add("build_prompt", time.perf_counter() - t0, 1)
            except RequestError as e:
                self.release(req.rid)
                sink.failed(req.rid, e)
                continue
            if not req.fast:
                self.eager.prefill(req, embeds)
                continue
            assert self.fast is not None
            longest = max([embeds.shape[0]] + [e.shape[0] for _, e in group])
            if group and (len(group) >= self.max_prefill_batch
                          or longest * (len(group) + 1) > self.max_prefill_tokens):
                self.fast.prefill(group)
                group = []
            group.append((req, embeds))
        if group:
            assert self.fast is not None
            self.fast.prefill(group)

    def _start(self, req: Request) -> torch.Tensor:
        """Build the prompt, take a KV slot and set the request's positions; returns the prompt embeddings."""
        if req.text_done and not req.has_words:
            raise RequestError("input text is empty", param="input")
        prompt = self.prompts.build(req.spec, req.track, req.text_done)
        n = prompt.embeds.shape[0]
        req.max_frames = min(req.max_frames, self.cache.max_len - n)
        if req.max_frames < 1:
            raise RequestError(f"prompt of {n} positions leaves no room in the {self.cache.max_len}-position "
                               "cache", param="input")
        req.slot = self.free_slots.pop(0)
        if self.timing is not None:
            self.timing.latency["admit"].append(time.perf_counter() - req.created)
        req.prompt_tokens = n
        req.length, req.offset = n, prompt.track_offset
        req.fast = self.fast is not None
        return prompt.embeds

    def _finish(self, sink: OutputSink) -> None:
        """Release every finished request whose audio has all been sent, and report it."""
        for rid in list(self.order):
            req = self.requests[rid]
            if req.finish_reason is not None and not req.buffer and not req.inflight:
                reason, n_in, n_out = req.finish_reason, req.text_tokens, req.n_frames
                self.release(rid)
                sink.finished(rid, reason, n_in, n_out)

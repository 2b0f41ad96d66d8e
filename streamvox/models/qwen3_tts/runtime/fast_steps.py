"""The fast path from the engine's side: prefills and frame steps on the slot-indexed `fast_path.FrameStepper`,
whose state (pending id, hidden state, sampling parameters) stays on the device.

Each step is one CUDA-graph replay per (row bucket, attention width) with no host sync; the chosen ids are
read back asynchronously one step later to notice end-of-speech (that wait also keeps the host at most one
step ahead of the GPU). Prefills of up to 512 positions replay a graph per (rows, length) bucket.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from streamvox.contract import OutputSink
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.decode_pipeline import POLL_INTERVAL_S, DecodePipeline
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper, row_bucket, width_bucket
from streamvox.models.qwen3_tts.runtime.requests import FrameHook, Request
from streamvox.models.qwen3_tts.runtime.timing import StepTiming, time_gpu


class FastSteps:
    """Drives the stepper for the requests on the fast path (`Request.fast`). `batch_prefill` False: prompts
    one at a time; `ignore_eos`: the chosen ids are never read back (no end-of-speech to notice)."""

    def __init__(self, stepper: FrameStepper, model: Qwen3TTSModel, requests: Mapping[str, Request],
                 pipeline: DecodePipeline, max_batch: int, batch_prefill: bool, ignore_eos: bool,
                 ar_stream: torch.cuda.Stream | None, dec_stream: torch.cuda.Stream | None,
                 timing: StepTiming | None, on_frame: FrameHook | None) -> None:
        self.stepper = stepper
        self.model = model
        self.requests = requests
        self.pipeline = pipeline
        self.max_batch = max_batch
        self.batch_prefill = batch_prefill
        self.ignore_eos = ignore_eos
        self.ar_stream, self.dec_stream = ar_stream, dec_stream
        self.timing = timing
        self.on_frame = on_frame
        # the previous step's chosen ids on their way to the host: (pinned ids, done event, requests by slot)
        self.pending: tuple[torch.Tensor | None, Any, dict[int, Request]] | None = None

    def prefill(self, group: list[tuple[Request, torch.Tensor]]) -> None:
        """Run the prompts of `group` (requests with their slots, and their prompt embeddings) in one forward."""
        st = self.stepper
        for req, _ in group:
            st.reset_slot(req.slot, req.talker_sampling.repetition_penalty, req.talker_sampling,  # type: ignore[arg-type]
                          req.predictor_sampling, req.seed)
        if len(group) == 1 and not self.batch_prefill:
            req, embeds = group[0]
            last = st.prefill(req.slot, embeds)  # type: ignore[arg-type]
            st.prefill_done(req.slot, embeds.shape[0], last)  # type: ignore[arg-type]
        else:
            st.prefill_batch([r.slot for r, _ in group], [e for _, e in group])  # type: ignore[misc]
        for req, _ in group:
            req.token = 0  # the real id stays on the device (MIN_NEW_TOKENS rules out end-of-speech here)
            req.history.append(0)

    def step(self, batch: list[Request], sink: OutputSink) -> None:
        """One frame for every request in `batch` through the slot-indexed stepper; then the end-of-speech ids
        of the previous step (an empty `batch` only collects those)."""
        st = self.stepper
        launched = None
        if batch:
            busy = [r for r in self.requests.values() if r.fast and r.slot is not None]
            rows = row_bucket(max(r.slot for r in busy) + 1, self.max_batch)  # type: ignore[type-var]
            width = width_bucket(max(r.length + 1 for r in busy if r.slot < rows), st.cache.max_len)
            cfg = self.model.cfg
            active = [False] * rows
            ids = [cfg.tts_pad_token_id] * rows
            for req in batch:
                slot = req.slot
                assert slot is not None
                active[slot] = True
                if req.offset is not None:
                    i = req.offset
                    ids[slot] = (req.track[i] if i < len(req.track)
                                 else cfg.tts_eos_token_id if i == len(req.track) else cfg.tts_pad_token_id)
                    req.offset += 1
            st.set_inputs(active, ids, rows)
            span = time_gpu(self.timing, f"frame_step_{rows}", self.ar_stream)
            st.step(rows, width, any(r.sampled for r in batch))
            span()
            frames = st.frames[:rows].clone()
            if self.dec_stream is not None:
                frames.record_stream(self.dec_stream)  # the decoder stream reads these later
            launched = frames
            # The chosen ids come back to pinned memory asynchronously; the next step waits for them. That
            # wait also keeps the host at most one step ahead of the GPU, so a new request's prefill is
            # never queued behind a backlog of frame steps; with end-of-speech ignored it still waits.
            tok = st.token[:rows]
            host = None
            if not self.ignore_eos:
                host = torch.empty(tok.shape, dtype=tok.dtype, pin_memory=tok.is_cuda)
                host.copy_(tok, non_blocking=True)
            event = None
            if tok.is_cuda:
                event = torch.cuda.Event()
                event.record()
            pending = (host, event, {r.slot: r for r in batch})  # type: ignore[misc]
        # End-of-speech chosen by the previous step: those requests get no frame from this one.
        eos = self.model.cfg.talker.codec_eos_token_id
        if self.pending is not None:
            host, event, reqs = self.pending
            if event is not None:
                self._wait(event, sink)
            ids_prev = host.tolist() if host is not None else []  # none: end-of-speech is ignored
            for slot, req in reqs.items() if ids_prev else ():
                if ids_prev[slot] == eos and req.finish_reason is None and req.slot == slot:
                    req.finish_reason = "stop"
                    req.token = None
            self.pending = None
        if launched is None:
            return
        for req in batch:
            if req.finish_reason is not None:
                continue
            req.length += 1
            req.add_frame(launched[req.slot], self.on_frame)
        self.pending = pending

    def _wait(self, event: torch.cuda.Event, sink: OutputSink) -> None:
        """Wait for the previous frame step (done or nearly, as this one is queued); meanwhile send the
        audio of decoder calls as they finish, so a first chunk does not wait for the next step."""
        if not self.pipeline.inflight:
            event.synchronize()
            return
        while not event.query():
            self.pipeline.poll(sink, block=False)
            time.sleep(POLL_INTERVAL_S)

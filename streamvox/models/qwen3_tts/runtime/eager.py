"""The eager path: prefill and frame steps through the model's own modules, request by request where
sampling needs it. It serves every request where there is no fast path (the CPU, unless switched on); with one
(CUDA), every request takes the fast path (`fast_steps.FastSteps`), whose greedy results it matches and whose
sampled results follow the same distributions from a different random stream."""

from __future__ import annotations

import torch

from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.model.modules import DenseCache
from streamvox.models.qwen3_tts.runtime.kv_cache import DecodeView, PrefillView, SlotCache
from streamvox.models.qwen3_tts.runtime.requests import FrameHook, Request
from streamvox.models.qwen3_tts.sampling import MIN_NEW_TOKENS, apply_repetition_penalty, select


class EagerPath:
    """Prefill and frame steps of the requests not on the fast path, writing into the shared `SlotCache`."""

    def __init__(self, model: Qwen3TTSModel, cache: SlotCache, suppress: torch.Tensor,
                 on_frame: FrameHook | None) -> None:
        self.model = model
        self.cache = cache
        self.suppress = suppress  # codebook-0 ids never chosen (`sampling.suppressed_codebook0_ids`)
        self.on_frame = on_frame
        self.groups = model.cfg.talker.num_code_groups

    def prefill(self, req: Request, embeds: torch.Tensor) -> None:
        """Run the request's prompt `[n, H]` into its KV slot and choose its first codebook-0 id."""
        n = embeds.shape[0]
        pos = torch.arange(n, device=self.model.device)[None]
        h = self.model.talker.model.run(embeds[None], pos, PrefillView(self.cache, req.slot))  # type: ignore[arg-type]
        req.hidden = h[0, -1]
        logits = self.model.talker.codec_head(req.hidden).float()
        self.choose(req, logits)

    def choose(self, req: Request, logits: torch.Tensor) -> None:
        """Pick the next codebook-0 id (or end the request on end-of-speech)."""
        eos = self.model.cfg.talker.codec_eos_token_id
        history = torch.tensor(req.history, dtype=torch.long, device=logits.device)
        logits = apply_repetition_penalty(logits, history, req.talker_sampling.repetition_penalty)
        mask = self.suppress
        if len(req.history) < MIN_NEW_TOKENS:
            mask = mask.clone()
            mask[eos] = True
        logits = logits.masked_fill(mask, float("-inf"))
        tok = select(logits, req.talker_sampling, req.generator)
        req.history.append(tok)
        if tok == eos:
            req.token = None
            req.finish_reason = "stop"
        else:
            req.token = tok

    def _predict_frames(self, batch: list[Request]) -> torch.Tensor:
        """Code predictor: codebooks 1..G-1 for each row. Returns frames `[B, G]`."""
        talker = self.model.talker
        cp = talker.code_predictor
        dev = self.model.device
        first = torch.tensor([r.token for r in batch], dtype=torch.long, device=dev)
        hidden = torch.stack([r.hidden for r in batch])  # type: ignore[misc]
        x = torch.stack([hidden, talker.model.codec_embedding(first)], dim=1)
        cache = DenseCache()
        all_greedy = all(r.predictor_sampling.greedy for r in batch)
        codes = [first]
        pos = torch.arange(2, device=dev)[None].expand(len(batch), -1)
        for j in range(self.groups - 1):
            h = cp.model.run(cp.small_to_mtp_projection(x), pos, cache)
            logits = cp.lm_head[j](h[:, -1]).float()
            if all_greedy:
                tok = logits.argmax(-1)  # one kernel, no per-row host round trips
            else:
                picked = [select(logits[i], r.predictor_sampling, r.generator) for i, r in enumerate(batch)]
                tok = torch.tensor(picked, dtype=torch.long, device=dev)
            codes.append(tok)
            if j + 1 < self.groups - 1:
                x = cp.model.codec_embedding[j](tok)[:, None]
                pos = torch.full((len(batch), 1), j + 2, dtype=torch.long, device=dev)
        return torch.stack(codes, dim=1)

    def step(self, batch: list[Request]) -> None:
        """One frame for every request in `batch`: the code predictor completes its pending frame, then the
        talker consumes the frame plus the next text-track item and chooses the next codebook-0 id."""
        frames = self._predict_frames(batch)
        cont: list[Request] = []
        rows: list[int] = []
        for i, req in enumerate(batch):
            if req.add_frame(frames[i], self.on_frame):
                cont.append(req)
                rows.append(i)
        if not cont:
            return
        talker = self.model.talker
        dev = self.model.device
        x = talker.frame_embed(frames[rows])
        text = []
        for req in cont:
            if req.offset is None:
                text.append(self.model.tts_pad)
            else:
                text.append(self.model.track_embed(req.track, req.offset, req.text_done))
                req.offset += 1
        x = (x + torch.stack(text))[:, None]
        slots = torch.tensor([r.slot for r in cont], dtype=torch.long, device=dev)
        pos = torch.tensor([r.length for r in cont], dtype=torch.long, device=dev)
        view = DecodeView(self.cache, slots, pos)
        h = talker.model.run(x, pos[:, None], view, view.mask())[:, 0]
        logits = talker.codec_head(h).float()
        for i, req in enumerate(cont):
            req.length += 1
            req.hidden = h[i]
            self.choose(req, logits[i])

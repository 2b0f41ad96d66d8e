"""Token selection for the talker and the code predictor.

Order of operations matches the upstream generation loop: repetition penalty, then
masking (minimum length / suppressed ids), then temperature, top-k and top-p. A
temperature of 0 (or `do_sample=False`) is greedy, and so is one below
`MIN_TEMPERATURE`, its limit: scores divided by 1e-38 overflow float32. Each row draws from its own
`torch.Generator`, so a request's samples do not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_NEW_TOKENS = 2  # upstream forbids end-of-speech for the first two codebook-0 ids
MIN_TEMPERATURE = 1e-5  # below it a draw is in effect the argmax: such a temperature is greedy


def suppressed_codebook0_ids(vocab_size: int, eos: int, ignore_eos: bool, device: torch.device) -> torch.Tensor:
    """The codebook-0 ids the talker never chooses, as a mask `[vocab_size]`: the last 1024 (control ids) but
    end-of-speech `eos`, and with `ignore_eos` (fixed-length benchmark output) end-of-speech too."""
    suppress = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    suppress[max(0, vocab_size - 1024):] = True
    suppress[eos] = False
    if ignore_eos:
        suppress[eos] = True
    return suppress


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits `[V]`; history: ids generated so far. Seen ids: positive / penalty, negative * penalty."""
    if penalty == 1.0 or history.numel() == 0:
        return logits
    seen = torch.unique(history)
    scores = logits[seen]
    logits = logits.clone()
    logits[seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits


def _warp(logits: torch.Tensor, s: SamplerSettings) -> torch.Tensor:
    if s.temperature != 1.0:
        logits = logits / s.temperature
    if s.top_k and s.top_k > 0:
        k = min(s.top_k, logits.shape[-1])
        kth = torch.topk(logits, k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= (1.0 - s.top_p)
        drop_sorted[..., -1:] = False  # always keep the most likely id
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def select(logits: torch.Tensor, s: SamplerSettings, generator: torch.Generator | None) -> int:
    """Pick one id from already-penalised/masked logits `[V]`."""
    if s.greedy:
        return int(torch.argmax(logits))
    probs = _warp(logits.float(), s).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))

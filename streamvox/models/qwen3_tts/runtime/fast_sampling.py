"""Sampling inside the fast path's frame step (`fast_path.FrameStepper`), with no host sync and static shapes.

A sampled row chooses `argmax(warp(logits) + Gumbel noise)`, which is a draw from `softmax(warp(logits))` (the
Gumbel-max trick), so sampling stays an argmax: the code predictor's fused select kernels and the talker's
`choose_commit` take the perturbed scores in place of the raw ones. `warp` is `sampling._warp`'s (temperature,
then top-k, then top-p) with per-row parameters read from device tensors, applied to logits that already carry
the repetition penalty and the masks, as the eager path applies them. Rows with temperature 0 keep their logits
untouched: their argmax is exactly the greedy choice.

The noise comes from a counter-based hash (splitmix64's mixer, in int64 tensor ops with wrapping products) of
(row seed, the slot's codebook-0 count, codebook, vocabulary id): no torch.Generator, so a seeded request draws
the same noise whatever else is batched with it. With the Triton decode kernels, one launch
(`kernels/triton_sampling.py`) does the warp and the noise of a choice, as the torch ops here do. The eager path
(`sampling.select`, the request's generator) draws from the same distributions but a different random stream: a
seed gives different audio on the two paths.
"""

from __future__ import annotations

import torch

from streamvox.models.qwen3_tts.sampling import SamplerSettings

_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64's increment and multipliers, as signed int64
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)
TALKER, PREDICTOR = 0, 1  # the two stages' rows in `SlotSampling`'s parameters


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's `>>` is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's output mixer over int64 tensors (bit patterns as uint64)."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def uniform(seed: torch.Tensor, counter: torch.Tensor, codebook: int, vocab: int) -> torch.Tensor:
    """Uniform float64 draws in (0, 1), `[R, vocab]`: a function of (seed `[R]`, counter `[R]`, codebook < 64,
    vocabulary id) only."""
    key = mix64(seed + mix64(counter * 64 + codebook))
    ids = torch.arange(1, vocab + 1, device=seed.device)
    bits = mix64(key[:, None] + ids[None] * _GAMMA)
    return (_shr(bits, 11).double() + 0.5) * 2.0**-53


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`sampling._warp` per row: logits `[R, V]` (float32) / temperature `[R]` (0 counts as 1), then ids below
    the row's `top_k`-th largest (0: all kept) and those outside its `top_p` nucleus (1: all kept) set to -inf.
    One ascending sort serves both filters; each drops the ids below a threshold value."""
    v = logits.shape[-1]
    x = logits / torch.where(temperature > 0, temperature, 1.0)[:, None]
    asc = x.sort(dim=-1).values
    k = torch.where(top_k > 0, top_k.clamp(max=v), v)
    kth = asc.gather(1, (v - k)[:, None])
    cum = asc.masked_fill(asc < kth, float("-inf")).softmax(-1).cumsum(-1)
    # the ascending prefix whose mass is at most 1 - top_p goes, the most likely id always stays
    drop = ((cum <= (1.0 - top_p)[:, None]) & (top_p < 1.0)[:, None]).sum(-1).clamp(max=v - 1)
    return x.masked_fill(x < torch.maximum(kth, asc.gather(1, drop[:, None])), float("-inf"))


def sampled_scores(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   seed: torch.Tensor, counter: torch.Tensor, codebook: int) -> torch.Tensor:
    """Scores `[R, V]` whose argmax is each row's choice: warped logits plus Gumbel noise where the row's
    temperature is above 0, the logits themselves (greedy) elsewhere."""
    u = uniform(seed, counter, codebook, logits.shape[-1])
    drawn = warp(logits, temperature, top_k, top_p) + (-torch.log(-torch.log(u))).float()
    return torch.where((temperature > 0)[:, None], drawn, logits)


def seed_bits(seed: int) -> int:
    """A request's seed as the int64 with its low 64 bits."""
    return ((seed & ((1 << 64) - 1)) ^ (1 << 63)) - (1 << 63)


class SlotSampling:
    """Each KV slot's sampling parameters on the device, for the talker's codebook-0 choice (`TALKER`) and the
    code predictor's (`PREDICTOR`), and its seed. `kernel` (with the Triton decode kernels): each choice in one
    launch (`kernels/triton_sampling.sample_scores`, for vocabularies it holds) instead of `sampled_scores`'s torch
    ops. (torch.compile of `sampled_scores` is not used: on the CPU, inductor's vectorised int64 code gave other
    bits than eager.)"""

    def __init__(self, slots: int, device: torch.device, kernel: bool = False) -> None:
        self.temperature = torch.zeros(2, slots, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(2, slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(2, slots, dtype=torch.float32, device=device)
        self.seed = torch.zeros(slots, dtype=torch.long, device=device)
        self.kernel, self.kernel_max_vocab = None, 0
        if kernel:
            from streamvox.models.qwen3_tts.kernels import triton_sampling

            self.kernel, self.kernel_max_vocab = triton_sampling.sample_scores, triton_sampling.MAX_VOCAB

    def set_slot(self, slot: int, talker: SamplerSettings | None, predictor: SamplerSettings | None,
                 seed: int) -> None:
        """A newly admitted request's settings (None: greedy). `fill_` with host numbers queues no sync."""
        for stage, s in ((TALKER, talker), (PREDICTOR, predictor)):
            s = s or SamplerSettings(temperature=0.0)
            self.temperature[stage, slot].fill_(max(s.temperature, 0.0))
            self.top_k[stage, slot].fill_(s.top_k)
            self.top_p[stage, slot].fill_(s.top_p)
        self.seed[slot].fill_(seed_bits(seed))

    def scores(self, logits: torch.Tensor, rows: slice | torch.Tensor, stage: int, counter: torch.Tensor,
               codebook: int) -> torch.Tensor:
        """`sampled_scores` for slots `rows` of `stage`, whose logits `[R, V]` (float32) are given."""
        fn = self.kernel if self.kernel is not None and logits.shape[-1] <= self.kernel_max_vocab else sampled_scores
        return fn(logits, self.temperature[stage, rows], self.top_k[stage, rows], self.top_p[stage, rows],
                  self.seed[rows], counter, codebook)

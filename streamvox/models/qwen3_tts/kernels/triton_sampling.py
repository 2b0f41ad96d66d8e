"""The fast path's sampled choice in one Triton launch per codebook (`runtime/fast_sampling.py` has the torch twin).

In torch ops, a sampled choice is ~25 launches for the warp (temperature, a sort, top-k and top-p thresholds) and
~50 for the counter-based hash that draws the Gumbel noise, over `[rows, vocab]`, 16 choices a frame. Here one
program a row holds the row's whole vocabulary (up to MAX_VOCAB ids) in registers: it sorts it, finds both
thresholds, draws the noise and writes the scores whose argmax is the choice. The hash works on uint64 (wrapping
products, logical shifts) and gives the twin's bits exactly; the logarithms are float64, rounded to float32. The
softmax's cumulative sum may round differently from torch's, which can move the top-p cut only where an id's
cumulative mass lies within rounding of `1 - top_p`. Tested under Triton's CPU interpreter
(tests/helpers/decode_kernels_job.py) and on a GPU against the twin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_VOCAB = 4096  # one program holds a row's vocabulary: the talker's 3072 ids and the predictor's 2048 fit


@triton.jit
def _mix64(x):
    """splitmix64's output mixer on uint64 values."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _at(values, rv, i):
    """values[i] of a register tensor (the only entry where rv == i)."""
    return tl.max(tl.where(rv == i, values, -float("inf")), axis=0)


@triton.jit
def _sample_kernel(logits_ptr, out_ptr, temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, counter_ptr, codebook, V,
                   stride_l, stride_o, BV: tl.constexpr):
    m = tl.program_id(0)
    rv = tl.arange(0, BV)
    ok = rv < V
    logit = tl.load(logits_ptr + m * stride_l + rv, mask=ok, other=-float("inf"))
    t = tl.load(temp_ptr + m)
    top_k = tl.load(top_k_ptr + m)
    top_p = tl.load(top_p_ptr + m)
    x = logit / tl.where(t > 0, t, 1.0)
    # ascending, the BV - V padding ids (-inf) first: the torch twin's index i is BV - V + i here
    asc = tl.sort(x)
    k = tl.where(top_k > 0, tl.minimum(top_k, V), V)
    kth = _at(asc, rv, BV - k)
    kept = tl.where(asc < kth, -float("inf"), asc)
    e = tl.exp(kept - tl.max(kept, axis=0))
    cum = tl.cumsum(e / tl.sum(e, axis=0), axis=0)
    drop = tl.where(top_p < 1.0, tl.sum((cum <= 1.0 - top_p).to(tl.int32), axis=0), 0)
    pth = _at(asc, rv, tl.minimum(drop, BV - 1))
    warped = tl.where(x < tl.maximum(kth, pth), -float("inf"), x)
    # Gumbel noise of (seed, counter, codebook, id), as fast_sampling.uniform
    seed = tl.load(seed_ptr + m).to(tl.uint64, bitcast=True)
    counter = tl.load(counter_ptr + m).to(tl.uint64, bitcast=True)
    key = _mix64(seed + _mix64(counter * 64 + codebook))
    bits = _mix64(key + (rv + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)  # splitmix64's increment
    u = ((bits >> 11).to(tl.float64) + 0.5) * 1.1102230246251565e-16  # 2**-53
    drawn = warped + (-tl.log(-tl.log(u))).to(tl.float32)
    tl.store(out_ptr + m * stride_o + rv, tl.where(t > 0, drawn, logit), mask=ok)


def sample_scores(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  seed: torch.Tensor, counter: torch.Tensor, codebook: int) -> torch.Tensor:
    """`fast_sampling.sampled_scores` in one launch: `[R, V]` float32 scores whose argmax is each row's choice
    (V at most MAX_VOCAB)."""
    r, v = logits.shape
    assert logits.stride(1) == 1 and logits.dtype == torch.float32 and v <= MAX_VOCAB
    out = torch.empty(r, v, dtype=torch.float32, device=logits.device)
    bv = triton.next_power_of_2(v)
    _sample_kernel[(r,)](logits, out, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(),
                         seed.contiguous(), counter.contiguous(), codebook, v, logits.stride(0), out.stride(0), BV=bv,
                         num_warps=8 if bv >= 2048 else 4)
    return out

"""The fast path's sampling noise in one Triton launch (`runtime/fast_sampling.py` has the torch twin).

In torch ops, the counter-based hash that draws each sampled row's Gumbel noise is ~50 elementwise launches over
`[rows, vocab]` per choice, 16 choices a frame; here it is one, fused with adding the noise to the warped scores
and keeping greedy rows' scores. The hash works on uint64 (wrapping products, logical shifts) and gives the torch
twin's bits exactly; the logarithms are float64 (libdevice against the host's libm), rounded to float32.
Tested under Triton's CPU interpreter (tests/helpers/decode_kernels_job.py) and on a GPU against the twin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mix64(x):
    """splitmix64's output mixer on uint64 values."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _add_gumbel_kernel(warped_ptr, logits_ptr, out_ptr, temp_ptr, seed_ptr, counter_ptr, codebook, V, stride_w,
                       stride_l, stride_o, BV: tl.constexpr):
    m = tl.program_id(0)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    ok = rv < V
    t = tl.load(temp_ptr + m)
    seed = tl.load(seed_ptr + m).to(tl.uint64, bitcast=True)
    counter = tl.load(counter_ptr + m).to(tl.uint64, bitcast=True)
    key = _mix64(seed + _mix64(counter * 64 + codebook))
    bits = _mix64(key + (rv + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)  # splitmix64's increment
    u = ((bits >> 11).to(tl.float64) + 0.5) * 1.1102230246251565e-16  # 2**-53
    noise = (-tl.log(-tl.log(u))).to(tl.float32)
    logit = tl.load(logits_ptr + m * stride_l + rv, mask=ok, other=0.0)
    drawn = tl.load(warped_ptr + m * stride_w + rv, mask=ok, other=0.0) + noise
    tl.store(out_ptr + m * stride_o + rv, tl.where(t > 0, drawn, logit), mask=ok)


def add_gumbel(warped: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
               counter: torch.Tensor, codebook: int) -> torch.Tensor:
    """`warped + Gumbel noise` where the row's temperature is above 0, `logits` elsewhere, `[R, V]` float32; the
    noise of (seed `[R]`, counter `[R]`, codebook, vocabulary id) as `fast_sampling.uniform`'s."""
    r, v = logits.shape
    assert warped.stride(1) == 1 and logits.stride(1) == 1 and warped.shape == logits.shape
    out = torch.empty(r, v, dtype=torch.float32, device=logits.device)
    bv = 1024
    _add_gumbel_kernel[(r, triton.cdiv(v, bv))](warped, logits, out, temperature.contiguous(), seed.contiguous(),
                                                 counter.contiguous(), codebook, v, warped.stride(0),
                                                 logits.stride(0), out.stride(0), BV=bv, num_warps=4)
    return out

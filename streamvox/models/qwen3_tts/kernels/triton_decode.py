"""Triton kernels for one decode position per row: a decoder layer in five or six launches.

The frame step runs 103 decoder layers per frame (28 talker + 15 code-predictor passes of 5), one
position per row: ~550 dependent kernels of a few microseconds each (one row, counted from the code),
whose time is set by how quickly each one gets its weight streaming, not by the step's total bytes.
Here a layer is

1. `linear(x, W_qkv, norm=input_layernorm)`: RMSNorm fused into the q/k/v projection;
2. `qk_norm_rope_store`: q/k head norms, RoPE from the positions, keys/values written to the cache;
3. `decode_attention`: each row's query heads over its cache slot, keys `[0, pos]`;
4. `linear(attn, W_o, residual=x)`;
5. `linear(x, W_gate_up, norm=post_attention_layernorm, swiglu=True)`;
6. `linear(mlp, W_down, residual=x)`.

`rope_attend` does 2 and 3 in one launch when no two rows share a cache slot (the code predictor's
single-position passes), the new key and value kept in registers; one program walks a row's keys, which
suits the predictor's <= 17 positions only (at 200 positions it took 21 us, the cache write and SDPA 8).
`split_attend` does the same for the talker's long caches, its programs each over a block of positions,
the last of a row's to finish combining their softmax states (flash decoding in one launch); with many rows
the talker attends with the cache write and SDPA instead (`Qwen3Settings.split_attend_max_rows`).

A few rows read each weight once, so a GEMM is fast when enough programs keep enough bytes in flight
(`_linear_config`): for one row, output tiles of 2..8 columns over the whole of K, summed
without tensor cores; for more rows, tl.dot tiles with narrow outputs splitting the reduction over K
across programs, the last program of a tile adding the partial sums in a fixed order, so results do not
vary from launch to launch. Between code
predictor passes, `linear(select=...)` picks the greedy id from the head's scores and looks up its
embedding in the GEMM that projects it, adding that embedding to the frame's sum (`select_rows` does the
same without a projection); `choose_commit` ends the frame step (codebook 0's greedy choice and the
per-row state) in one launch. Each launch saved is worth about a microsecond at one row (H200).

Rows are tokens: row `m` writes its key/value at `pos[m]` of cache slot `slot[m]` and attends to
positions `[0, pos[m]]` of that slot, so the code predictor's first pass (two positions per request) is
two rows with the same slot. Arithmetic is float32 inside each kernel with the input dtype at its
boundaries; `tests` and `benchmarks/gpu_bench.py --check` compare it with the torch layers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["choose_commit", "decode_attention", "linear", "qk_norm_rope_store", "rms_norm", "rope_attend",
           "select_rows", "split_attend", "swiglu_rows"]


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; float32 inputs in full precision (IEEE), not TF32."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _mac(acc, xk, wt, DOT: tl.constexpr, IEEE: tl.constexpr):
    """acc [BM, BN] + xk [BM, BK] @ wt [BN, BK].T: on tensor cores (DOT), or as float32 products summed
    over BK, which allows output tiles narrower than tl.dot's 16 columns (for one row)."""
    if DOT:
        acc += _dot(xk, tl.trans(wt), IEEE)
    else:
        acc += tl.sum(xk.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
    return acc


@triton.jit
def _linear_kernel(x_ptr, w_ptr, norm_ptr, res_ptr, bias_ptr, sel_ptr, tok_ptr, total_ptr, out_ptr, part_ptr,
                   count_ptr, M, N, K, KS, V, half_n, stride_x, stride_w, stride_r, stride_sel, stride_tok, stride_t,
                   stride_o, eps,
                   NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr,
                   SELECT: tl.constexpr, ACCUM: tl.constexpr, IEEE: tl.constexpr, DOT: tl.constexpr,
                   SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    if SELECT:  # x is a table; row m uses its row argmax(sel[m]) (the first maximum, as torch.argmax)
        xr = _argmax_rows(sel_ptr, rm, m_ok, stride_sel, V, BM, BV)
        xr = xr.to(tl.int64)
        if (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            tl.store(tok_ptr + rm * stride_tok, xr, mask=m_ok)
            if ACCUM:
                _add_rows(x_ptr, xr, total_ptr, total_ptr, rm, m_ok, K, stride_x, stride_t, 0, False, BM, BK)
    else:
        xr = rm
    if NORM:
        sq = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            xk = tl.load(x_ptr + xr[:, None] * stride_x + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                         other=0.0).to(tl.float32)
            sq += tl.sum(xk * xk, axis=1)
        inv = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc2 = tl.zeros([BM, BN], dtype=tl.float32)
    k_start = tl.program_id(2) * KS  # split-K: this program's share of the reduction
    for k0 in range(k_start, tl.minimum(k_start + KS, K), BK):
        kk = k0 + rk
        k_ok = kk < K
        xk = tl.load(x_ptr + xr[:, None] * stride_x + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            xk = _scale_norm(xk, inv, norm_ptr, kk, k_ok)
        wt = tl.load(w_ptr + rn[:, None] * stride_w + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _mac(acc, xk, wt, DOT, IEEE)
        if SWIGLU:
            wu = tl.load(w_ptr + (rn + half_n)[:, None] * stride_w + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc2 = _mac(acc2, xk, wu, DOT, IEEE)
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        _linear_epilogue(acc, acc2, rm, rn, mask, n_ok, x_ptr, bias_ptr, res_ptr, out_ptr, stride_r, stride_o, SWIGLU,
                         RESIDUAL, BIAS)
    else:
        # Each program leaves its partial sums in part_ptr [SPLIT, 2, M, N]; the last of a tile's SPLIT
        # programs to finish (a counter per tile) adds them in split order, so the result does not
        # depend on which one that is, and finishes the tile.
        part = part_ptr + rm[:, None] * N + rn[None, :]
        tl.store(part + tl.program_id(2) * 2 * M * N, acc, mask=mask)
        if SWIGLU:
            tl.store(part + (tl.program_id(2) * 2 + 1) * M * N, acc2, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        tile = count_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc2 = tl.zeros([BM, BN], dtype=tl.float32)
            for i in tl.static_range(SPLIT):
                acc += tl.load(part + i * 2 * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                if SWIGLU:
                    acc2 += tl.load(part + (i * 2 + 1) * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(tile, 0)  # ready for the next launch
            _linear_epilogue(acc, acc2, rm, rn, mask, n_ok, x_ptr, bias_ptr, res_ptr, out_ptr, stride_r, stride_o,
                             SWIGLU, RESIDUAL, BIAS)


@triton.jit
def _add_rows(table_ptr, xr, total_ptr, out_ptr, rm, m_ok, K, stride_x, stride_t, stride_o, OUT: tl.constexpr,
              BM: tl.constexpr, BK: tl.constexpr):
    """`total[m] += table[xr[m]]` for rows `rm`, rounded to total's dtype as a torch add of the two rounds it
    (the frame's codebook-embedding sum, built as the codes are chosen); also `out[m] = table[xr[m]]` (OUT)."""
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        mask = m_ok[:, None] & (kk < K)[None, :]
        row = tl.load(table_ptr + xr[:, None] * stride_x + kk[None, :], mask=mask, other=0.0)
        tot = total_ptr + rm[:, None] * stride_t + kk[None, :]
        total = tl.load(tot, mask=mask, other=0.0).to(tl.float32) + row.to(tl.float32)
        tl.store(tot, total.to(tot.dtype.element_ty), mask=mask)
        if OUT:
            tl.store(out_ptr + rm[:, None] * stride_o + kk[None, :], row, mask=mask)


@triton.jit
def _argmax_rows(sel_ptr, rm, m_ok, stride_sel, V, BM: tl.constexpr, BV: tl.constexpr):
    """Each row's argmax of its scores `sel[m, :V]` (the first maximum, as torch.argmax), int32 `[BM]`."""
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    xr = tl.zeros([BM], dtype=tl.int32)
    for v0 in range(0, V, BV):
        rv = v0 + tl.arange(0, BV)
        sv = tl.load(sel_ptr + rm[:, None] * stride_sel + rv[None, :], mask=m_ok[:, None] & (rv < V)[None, :],
                     other=float("-inf"))
        top = tl.max(sv, axis=1)
        better = top > best
        xr = tl.where(better, tl.argmax(sv, axis=1) + v0, xr)
        best = tl.where(better, top, best)
    return xr


@triton.jit
def _scale_norm(xk, inv, norm_ptr, kk, k_ok):
    """RMSNorm of the columns `kk` of rows `xk` `[BM, BK]` with reciprocal RMS `inv` `[BM]`, as the torch
    layers do it: normalise in float32, round, then scale by the weight."""
    dt = xk.dtype
    wn = tl.load(norm_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    return ((xk.to(tl.float32) * inv[:, None]).to(dt).to(tl.float32) * wn[None, :]).to(dt)


@triton.jit
def _linear_epilogue(acc, acc2, rm, rn, mask, n_ok, x_ptr, bias_ptr, res_ptr, out_ptr, stride_r, stride_o,
                     SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr):
    """Bias, SwiGLU, residual, rounding to x's dtype, store."""
    dt = x_ptr.dtype.element_ty
    out = acc
    if BIAS:
        out += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if SWIGLU:
        g = acc.to(dt).to(tl.float32)
        out = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * acc2.to(dt).to(tl.float32)
    if RESIDUAL:
        out = out.to(dt).to(tl.float32) + tl.load(res_ptr + rm[:, None] * stride_r + rn[None, :], mask=mask,
                                                  other=0.0).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * stride_o + rn[None, :], out.to(dt).to(out_ptr.dtype.element_ty), mask=mask)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _linear_config(m: int, n: int, k: int, swiglu: bool) -> tuple[int, int, int, int, int, int, bool]:
    """(BM, BN, BK, num_warps, num_stages, split, dot) for an `[m, k] x [k, n]` product (`n`: output
    columns), from tools/kernel_lab/tune_decode_kernels.py on an H200 at the 1.7B shapes, weights read from memory
    as in the frame step. A few rows read each weight once, so what counts is keeping enough bytes in
    flight in enough programs. Up to GEMV_MAX_ROWS rows: no tensor cores (`dot` False), narrow output
    tiles over the whole of K, no split. More rows (tl.dot tiles are at least 16 wide): outputs of up to
    3072 columns split K four ways, q/k/v two or four ways; the gate/up GEMMs need no split."""
    if m <= GEMV_MAX_ROWS:
        # about 512..1536 programs, each over the whole of K in one or a few blocks; the best measured (BN, BK):
        # pred.o (2, 2048) 3.9 us, pred.qkv (4, 1024) 5.7, talker.down (2, 2048) 9.6, talker.gate_up (8, 1024) 16.5
        bn = min(max(_pow2(-(-n // 1024)), 2), 8)
        return _pow2(m), bn, min(_pow2(k), 1024 if swiglu else 2048), 4, 2, 1, False
    bm = min(max(_pow2(m), 16), 64)
    if swiglu:
        return (bm, 64, 128, 8, 5 if bm == 16 else 3, 1, True) if n > 4096 else (bm, 32, 256, 4, 3, 1, True)
    if n >= 4096:
        return bm, 64, 128, 8, 5 if bm <= 32 else 3, 4 if k >= 2048 else 2, True
    return bm, 32, 128, 4, 5 if bm <= 32 else 3, 4, True


# Products of this many rows use the narrow tiles without tensor cores. H200, 1.7B frame-step graph at one row:
# 3.85 ms against 4.32 with tl.dot tiles; with them up to four rows as well, 5.19 against 4.54 ms at four.
GEMV_MAX_ROWS = 1
# From this many rows on, `linear` runs its GEMM in cuBLAS (torch.mm / addmm), with the norm and SwiGLU as
# separate Triton launches: in a 64-row frame step on the H200 this file's GEMM kernel took 13.2 us per
# launch on average, cuBLAS's kernels in the torch layers' step about 7 (`gpu_bench.py --profile`).
CUBLAS_MIN_ROWS = 32

_counters: dict[torch.device, torch.Tensor] = {}
MAX_TILES = 4096  # split-K tiles (row blocks x column blocks) of one launch


def _tile_counters(device: torch.device) -> torch.Tensor:
    """Zeroed counters for split-K tiles, shared by every launch on the device: a launch's last program
    per tile sets its counter back to zero, and launches on one stream do not overlap."""
    if device not in _counters:
        _counters[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return _counters[device]


def linear(x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 0.0,
           swiglu: bool = False, residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, select: torch.Tensor | None = None,
           tokens: torch.Tensor | None = None, total: torch.Tensor | None = None) -> torch.Tensor:
    """`x [M, K] @ w[N, K].T` with optional fusions: `norm` (RMSNorm weight `[K]`) applied to x first;
    `swiglu` (w is gate rows then up rows: returns `silu(gate) * up`, `[M, N/2]`); `bias` `[N]`;
    `residual` `[M, N]` added to the output. `out_dtype`: the result rounded to x's dtype, then stored
    as this one. `select` (float32 scores `[M, V]`): x is a table, and row m of the product uses its row
    `argmax(select[m])`, which also goes to `tokens` `[M]` (int64, any stride): an embedding lookup of
    the greedy choice, fused into the GEMM that consumes it; that row is also added to `total` `[M, K]` if
    given (as `select_rows`)."""
    m = select.shape[0] if select is not None else x.shape[0]
    k = x.shape[1]
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    assert x.stride(1) == 1 and w.stride(1) == 1 and w.shape[1] == k
    assert not (swiglu and bias is not None) and (select is None) == (tokens is None)
    if m >= CUBLAS_MIN_ROWS and select is None:
        return _linear_cublas(x, w, norm, eps, swiglu, residual, bias, out_dtype)
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    bm, bn, bk, warps, stages, split, dot = _linear_config(m, n, k, swiglu)
    if x.element_size() == 4:  # the same tiles in bytes (shared memory) as in 16-bit
        bk //= 2
    ks = triton.cdiv(triton.cdiv(k, split), bk) * bk  # each split a whole number of BK blocks
    split = triton.cdiv(k, ks)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    part, counters = out, out
    if split > 1:
        assert grid[0] * grid[1] <= MAX_TILES
        part = torch.empty(split, 2, m, n, dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device)
    res = residual if residual is not None else out
    sel, tok, tot = (t if t is not None else out for t in (select, tokens, total))  # unused pointers: any tensor
    _linear_kernel[grid](
        x, w, norm if norm is not None else w, res, bias if bias is not None else w, sel, tok, tot, out, part,
        counters, m, n, k, ks, sel.shape[1], n, x.stride(0), w.stride(0), res.stride(0), sel.stride(0), tok.stride(0),
        tot.stride(0), out.stride(0), eps, NORM=norm is not None, SWIGLU=swiglu, RESIDUAL=residual is not None,
        BIAS=bias is not None, SELECT=select is not None, ACCUM=total is not None, IEEE=x.dtype == torch.float32,
        DOT=dot, SPLIT=split, BM=bm, BN=bn, BK=bk, BV=256, num_warps=warps, num_stages=stages)
    return out


def _linear_cublas(x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor | None, eps: float, swiglu: bool,
                   residual: torch.Tensor | None, bias: torch.Tensor | None,
                   out_dtype: torch.dtype | None) -> torch.Tensor:
    """`linear` for many rows: the GEMM in cuBLAS (the residual added in the same call by addmm), the norm
    and SwiGLU in one launch each."""
    h = rms_norm(x, norm, eps) if norm is not None else x
    if residual is not None:
        out = torch.addmm(residual if bias is None else residual + bias, h, w.t())
    else:
        out = torch.nn.functional.linear(h, w, bias)
    if swiglu:
        out = swiglu_rows(out)
    return out if out_dtype is None else out.to(out_dtype)


@triton.jit
def _select_rows_kernel(sel_ptr, table_ptr, tok_ptr, total_ptr, out_ptr, V, K, stride_sel, stride_x, stride_tok,
                        stride_t, stride_o, OUT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) + tl.arange(0, 1)
    ok = rm >= 0
    xr = _argmax_rows(sel_ptr, rm, ok, stride_sel, V, 1, BV).to(tl.int64)
    tl.store(tok_ptr + rm * stride_tok, xr)
    _add_rows(table_ptr, xr, total_ptr, out_ptr, rm, ok, K, stride_x, stride_t, stride_o, OUT, 1, BK)


def select_rows(scores: torch.Tensor, table: torch.Tensor, tokens: torch.Tensor, total: torch.Tensor,
                embed: bool = True) -> torch.Tensor | None:
    """Greedy choice and embedding lookup in one launch: row m's token `argmax(scores[m])` (the first maximum)
    goes to `tokens` `[M]` (int64, any stride) and its `table` row is added to `total` `[M, K]` (the frame's
    codebook-embedding sum); with `embed`, that row is also returned `[M, K]` (the next pass's input)."""
    m, k = scores.shape[0], table.shape[1]
    assert scores.stride(1) == 1 and table.stride(1) == 1 and total.stride(1) == 1
    out = torch.empty(m, k, dtype=table.dtype, device=table.device) if embed else total
    _select_rows_kernel[(m,)](scores, table, tokens, total, out, scores.shape[1], k, scores.stride(0),
                              table.stride(0), tokens.stride(0), total.stride(0), out.stride(0), OUT=embed, BV=1024,
                              BK=1024, num_warps=4)
    return out if embed else None


@triton.jit
def _choose_commit_kernel(logits_ptr, h_ptr, pen_ptr, seen_ptr, suppress_ptr, eos_ptr, count_ptr, pos_ptr, active_ptr,
                          token_ptr, hidden_ptr, V, H, min_new, stride_l, stride_h, stride_seen, stride_hid,
                          BV: tl.constexpr, BH: tl.constexpr):
    m = tl.program_id(0)
    pen = tl.load(pen_ptr + m)
    count = tl.load(count_ptr + m)
    active = tl.load(active_ptr + m) != 0
    best = -float("inf")
    tok = 0
    for v0 in range(0, V, BV):
        rv = v0 + tl.arange(0, BV)
        ok = rv < V
        logit = tl.load(logits_ptr + m * stride_l + rv, mask=ok, other=0.0)
        seen = tl.load(seen_ptr + m * stride_seen + rv, mask=ok, other=0) != 0
        # the repetition penalty (division rounded as torch's), then the suppressed ids, and end-of-speech
        # before the minimum length
        logit = tl.where(seen, tl.where(logit < 0, logit * pen, tl.math.div_rn(logit, pen)), logit)
        banned = (tl.load(suppress_ptr + rv, mask=ok, other=1) != 0) | (
            (tl.load(eos_ptr + rv, mask=ok, other=0) != 0) & (count < min_new))
        logit = tl.where(banned, -float("inf"), logit)
        top = tl.max(logit, axis=0)
        if top > best:  # the first maximum, as torch.argmax
            tok = tl.argmax(logit, axis=0) + v0
            best = top
    if active:
        tl.store(token_ptr + m, tok.to(tl.int64))
        tl.store(seen_ptr + m * stride_seen + tok, 1)
        tl.store(count_ptr + m, count + 1)
        tl.store(pos_ptr + m, tl.load(pos_ptr + m) + 1)
        for k0 in range(0, H, BH):
            kk = k0 + tl.arange(0, BH)
            tl.store(hidden_ptr + m * stride_hid + kk, tl.load(h_ptr + m * stride_h + kk, mask=kk < H), mask=kk < H)


def choose_commit(logits: torch.Tensor, h: torch.Tensor, penalty: torch.Tensor, seen: torch.Tensor,
                  suppress: torch.Tensor, eos_mask: torch.Tensor, count: torch.Tensor, pos: torch.Tensor,
                  active: torch.Tensor, token: torch.Tensor, hidden: torch.Tensor, min_new: int) -> None:
    """The frame step's end for rows `[0, M)`, in one launch: each row's greedy codebook-0 id from its talker
    scores `logits` `[M, V]` (float32) after the repetition penalty on the ids it has `seen`, the `suppress`ed
    ids and end-of-speech (`eos_mask`) while `count` < `min_new`; an active row then takes that id as its
    `token`, `h` as its `hidden` state, marks the id seen and counts one more id and position. Inactive rows
    keep everything. As `fast_path.FrameStepper._choose` and `_commit` in torch."""
    m, v = logits.shape
    assert logits.stride(1) == 1 and h.stride(1) == 1 and seen.stride(1) == 1 and hidden.stride(1) == 1
    _choose_commit_kernel[(m,)](logits, h, penalty, seen, suppress, eos_mask, count, pos, active, token, hidden, v,
                                h.shape[1], min_new, logits.stride(0), h.stride(0), seen.stride(0), hidden.stride(0),
                                BV=1024, BH=1024, num_warps=4)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, K, stride_x, stride_o, eps, BK: tl.constexpr):
    m = tl.program_id(0)
    dt = x_ptr.dtype.element_ty
    sq = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        xk = tl.load(x_ptr + m * stride_x + kk, mask=kk < K, other=0.0).to(tl.float32)
        sq += xk * xk
    inv = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        xk = tl.load(x_ptr + m * stride_x + kk, mask=kk < K, other=0.0).to(tl.float32)
        wn = tl.load(w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        # as RMSNorm: normalise in float32, round, then scale by the weight
        tl.store(out_ptr + m * stride_o + kk, ((xk * inv).to(dt).to(tl.float32) * wn).to(dt), mask=kk < K)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of `x` `[M, K]` with weight `w` `[K]`, rounded as the torch layers round it."""
    assert x.stride(1) == 1
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.shape[0],)](x, w, out, x.shape[1], x.stride(0), out.stride(0), eps, BK=1024, num_warps=4)
    return out


@triton.jit
def _swiglu_kernel(gu_ptr, out_ptr, N, stride_g, stride_o, BN: tl.constexpr):
    m = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = rn < N
    dt = gu_ptr.dtype.element_ty
    g = tl.load(gu_ptr + m * stride_g + rn, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + m * stride_g + N + rn, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_o + rn, ((g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u).to(dt), mask=ok)


def swiglu_rows(gu: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` of `gu` `[M, 2N]` (gate columns, then up), rounded as the torch layers round it."""
    m, n = gu.shape[0], gu.shape[1] // 2
    assert gu.stride(1) == 1
    out = torch.empty(m, n, dtype=gu.dtype, device=gu.device)
    _swiglu_kernel[(m, triton.cdiv(n, 1024))](gu, out, n, gu.stride(0), out.stride(0), BN=1024, num_warps=4)
    return out


@triton.jit
def _norm_rope(src, w_ptr, inv_freq_ptr, pos, eps, rows, r, ok, HD: tl.constexpr, NORM: tl.constexpr):
    """Heads `rows` [R] at `src` (head_dim HD): RMS-normalised by weight `w_ptr` and rotated by angle
    pos * inv_freq (NORM), or as loaded; returned as float32 halves `[R, BH]` rounded to the input dtype."""
    half: tl.constexpr = HD // 2
    dt = src.dtype.element_ty
    mask = ok[None, :]
    x1 = tl.load(src + rows[:, None] * HD + r[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + rows[:, None] * HD + half + r[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HD + eps)
        w1 = tl.load(w_ptr + r, mask=ok, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + half + r, mask=ok, other=0.0).to(tl.float32)
        x1 = ((x1 * inv[:, None]).to(dt).to(tl.float32) * w1[None, :]).to(dt).to(tl.float32)
        x2 = ((x2 * inv[:, None]).to(dt).to(tl.float32) * w2[None, :]).to(dt).to(tl.float32)
        f = pos.to(tl.float32) * tl.load(inv_freq_ptr + r, mask=ok, other=0.0)
        c = tl.cos(f).to(dt).to(tl.float32)[None, :]
        s = tl.sin(f).to(dt).to(tl.float32)[None, :]
        return (x1 * c - x2 * s).to(dt).to(tl.float32), (x2 * c + x1 * s).to(dt).to(tl.float32)
    return x1, x2


@triton.jit
def _store_halves(dst, rows, stride, r, ok, o1, o2, HD: tl.constexpr):
    mask = ok[None, :]
    tl.store(dst + rows[:, None] * stride + r[None, :], o1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + rows[:, None] * stride + HD // 2 + r[None, :], o2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _attend(q1, q2, k_ptr, v_ptr, base, lo, n, stride_cl, r, ok, best, total, acc1, acc2, HD: tl.constexpr,
            BL: tl.constexpr):
    """Online-softmax attention of query halves `[REP, BH]` (already scaled) over keys/values `[lo, n)` at
    `base + position * stride_cl`, continuing from running max `best`, sum `total` and output sums `acc1`,
    `acc2`; returns them updated (the output is `acc / total`)."""
    half: tl.constexpr = HD // 2
    for start in range(lo, n, BL):
        rl = start + tl.arange(0, BL)
        mask = (rl < n)[:, None] & ok[None, :]
        offs = base + rl[:, None] * stride_cl + r[None, :]
        k1 = tl.load(k_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
        v1 = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v2 = tl.load(v_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(q1[:, None, :] * k1[None, :, :], axis=2) + tl.sum(q2[:, None, :] * k2[None, :, :], axis=2)
        s = tl.where((rl < n)[None, :], s, float("-inf"))
        new = tl.maximum(best, tl.max(s, axis=1))
        alpha = tl.exp(best - new)
        p = tl.exp(s - new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * v1[None, :, :], axis=1)
        acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * v2[None, :, :], axis=1)
        best = new
    return best, total, acc1, acc2


@triton.jit
def _qk_norm_rope_store_kernel(qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr,
                               stride_qkv, stride_cs, stride_ch, stride_cl, eps, NH: tl.constexpr,
                               NKV: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr):
    m = tl.program_id(0)
    h = tl.program_id(1)  # query heads, then key heads, then value heads
    r = tl.arange(0, BH)  # BH: HD / 2 rounded up to a power of two
    ok = r < HD // 2
    one = tl.arange(0, 1)
    src = qkv_ptr + m * stride_qkv + h * HD
    pos = tl.load(pos_ptr + m)
    cache_off = tl.load(slot_ptr + m) * stride_cs + pos * stride_cl
    if h < NH:
        o1, o2 = _norm_rope(src, qn_ptr, inv_freq_ptr, pos, eps, one, r, ok, HD, True)
        _store_halves(q_ptr + (m * NH + h) * HD, one, 0, r, ok, o1, o2, HD)
    elif h < NH + NKV:
        o1, o2 = _norm_rope(src, kn_ptr, inv_freq_ptr, pos, eps, one, r, ok, HD, True)
        _store_halves(k_ptr + cache_off + (h - NH) * stride_ch, one, 0, r, ok, o1, o2, HD)
    else:
        o1, o2 = _norm_rope(src, kn_ptr, inv_freq_ptr, pos, eps, one, r, ok, HD, False)
        _store_halves(v_ptr + cache_off + (h - NH - NKV) * stride_ch, one, 0, r, ok, o1, o2, HD)


def qk_norm_rope_store(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, inv_freq: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor,
                       heads: int, kv_heads: int, eps: float) -> torch.Tensor:
    """qkv `[M, (heads + 2 kv_heads) * hd]` -> normalised, rotated queries `[M, heads, hd]`; the keys
    (normalised, rotated) and values go to `k_cache`/`v_cache` `[slots, kv_heads, L, hd]` at
    `[slot[m], :, pos[m]]`. RoPE angle: `pos * inv_freq` (float32, as `model/modules.Rope`)."""
    m = qkv.shape[0]
    hd = k_cache.shape[-1]
    assert qkv.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    q = torch.empty(m, heads, hd, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_store_kernel[(m, heads + 2 * kv_heads)](
        qkv, q_norm, k_norm, inv_freq, q, k_cache, v_cache, slot, pos, qkv.stride(0), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), eps, NH=heads, NKV=kv_heads, HD=hd, BH=_pow2(hd // 2), num_warps=1)
    return q


@triton.jit
def _rope_attend_kernel(qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, out_ptr,
                        stride_qkv, stride_cs, stride_ch, stride_cl, eps, scale, NH: tl.constexpr,
                        NKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr,
                        BL: tl.constexpr):
    m = tl.program_id(0)
    _rope_attend_row(tl.program_id(1), tl.load(slot_ptr + m), tl.load(pos_ptr + m), qkv_ptr + m * stride_qkv,
                     qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, out_ptr + m * NH * HD, stride_cs, stride_ch, stride_cl,
                     eps, scale, NH, NKV, REP, HD, BH, BL)


@triton.jit
def _rope_attend_row(g, slot, pos, src, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, out_ptr, stride_cs,
                     stride_ch, stride_cl, eps, scale, NH: tl.constexpr, NKV: tl.constexpr, REP: tl.constexpr,
                     HD: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr):
    """`rope_attend` of one row (q/k/v at `src`, cache slot `slot`, new position `pos`) and key/value head
    `g`: its query heads' outputs go to `out_ptr` (the row's `[NH * HD]`)."""
    r = tl.arange(0, BH)
    ok = r < HD // 2
    _, total, o1, o2 = _rope_attend_span(g, slot, pos, 0, pos + 1, src, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr,
                                         stride_cs, stride_ch, stride_cl, eps, scale, NH, NKV, REP, HD, BH, BL)
    _store_halves(out_ptr, g * REP + tl.arange(0, REP), HD, r, ok, o1 / total[:, None], o2 / total[:, None], HD)


@triton.jit
def _rope_attend_span(g, slot, pos, lo, hi, src, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, stride_cs, stride_ch,
                      stride_cl, eps, scale, NH: tl.constexpr, NKV: tl.constexpr, REP: tl.constexpr,
                      HD: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr):
    """Key/value head `g`'s query heads (q/k/v of one row at `src`, new position `pos`, cache slot `slot`)
    over the positions `[lo, hi)` of `[0, pos]`: the softmax state (max, sum, output sums). When the span
    holds `pos`, the new key and value come from registers (the softmax starts from their score, and the
    cached positions are read while these are computed) and are stored in the cache afterwards."""
    r = tl.arange(0, BH)
    ok = r < HD // 2
    one = tl.arange(0, 1)
    heads = g * REP + tl.arange(0, REP)
    base = slot * stride_cs + g * stride_ch
    q1, q2 = _norm_rope(src, qn_ptr, inv_freq_ptr, pos, eps, heads, r, ok, HD, True)
    q1, q2 = q1 * scale, q2 * scale
    k1, k2 = _norm_rope(src + (NH + g) * HD, kn_ptr, inv_freq_ptr, pos, eps, one, r, ok, HD, True)
    v1, v2 = _norm_rope(src + (NH + NKV + g) * HD, kn_ptr, inv_freq_ptr, pos, eps, one, r, ok, HD, False)
    holds_pos = (lo <= pos) & (pos < hi)
    best = tl.where(holds_pos, tl.sum(q1 * k1, axis=1) + tl.sum(q2 * k2, axis=1), float("-inf"))
    total = tl.where(holds_pos, 1.0, 0.0) + tl.zeros([REP], dtype=tl.float32)
    acc1 = tl.where(holds_pos, v1, 0.0) + tl.zeros([REP, BH], dtype=tl.float32)
    acc2 = tl.where(holds_pos, v2, 0.0) + tl.zeros([REP, BH], dtype=tl.float32)
    best, total, acc1, acc2 = _attend(q1, q2, k_ptr, v_ptr, base, lo, tl.minimum(hi, pos), stride_cl, r, ok, best,
                                      total, acc1, acc2, HD, BL)
    if holds_pos:
        _store_halves(k_ptr + base + pos * stride_cl, one, 0, r, ok, k1, k2, HD)
        _store_halves(v_ptr + base + pos * stride_cl, one, 0, r, ok, v1, v2, HD)
    return best, total, acc1, acc2


def _attend_config(rows: int) -> tuple[int, int]:
    """(BL positions per block, num_warps) for `rope_attend` over the code predictor's 17 positions: four
    warps for a few rows, one for many (H200: 4.7 against 5.2 us at one row, 5.8 against 7.3 at 64;
    tune_decode_kernels.py)."""
    return 16, 4 if rows <= 4 else 1


def rope_attend(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, inv_freq: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor, heads: int,
                eps: float) -> torch.Tensor:
    """`qk_norm_rope_store` then `decode_attention` in one launch, for rows whose slots all differ (one
    new position per cache slot): a program attends with its row's new key/value from registers and
    stores them, so no program reads a position that another one writes."""
    m = qkv.shape[0]
    kv_heads, hd = k_cache.shape[1], k_cache.shape[-1]
    assert qkv.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    out = torch.empty(m, heads * hd, dtype=qkv.dtype, device=qkv.device)
    bl, warps = _attend_config(m)
    _rope_attend_kernel[(m, kv_heads)](
        qkv, q_norm, k_norm, inv_freq, k_cache, v_cache, slot, pos, out, qkv.stride(0), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), eps, hd**-0.5, NH=heads, NKV=kv_heads, REP=heads // kv_heads, HD=hd,
        BH=_pow2(hd // 2), BL=bl, num_warps=warps)
    return out


@triton.jit
def _split_attend_kernel(qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, out_ptr, part_ptr,
                         count_ptr, width, stride_qkv, stride_cs, stride_ch, stride_cl, eps, scale, NH: tl.constexpr,
                         NKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr,
                         BLK: tl.constexpr):
    m = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)  # this program's block of positions: [s * BLK, (s + 1) * BLK), within [0, width)
    splits = tl.num_programs(2)
    pos = tl.load(pos_ptr + m)
    if s * BLK <= pos:
        hi = tl.minimum((s + 1) * BLK, width)
        best, total, acc1, acc2 = _rope_attend_span(g, tl.load(slot_ptr + m), pos, s * BLK, hi,
                                                    qkv_ptr + m * stride_qkv, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr,
                                                    v_ptr, stride_cs, stride_ch, stride_cl, eps, scale, NH, NKV, REP,
                                                    HD, BH, BL)
        # The softmax state to part_ptr [M, NKV, splits, REP, HD + 2] (output sums, max, sum); the last of the
        # row's non-empty blocks to finish (a counter per row and key/value head) combines them in block order.
        r = tl.arange(0, BH)
        ok = r < HD // 2
        rows = tl.arange(0, REP)
        part = part_ptr + (m * NKV + g) * splits * REP * (HD + 2)
        here = part + s * REP * (HD + 2)
        _store_halves(here, rows, HD + 2, r, ok, acc1, acc2, HD)
        tl.store(here + rows * (HD + 2) + HD, best)
        tl.store(here + rows * (HD + 2) + HD + 1, total)
        tl.debug_barrier()  # every thread's part is written before the counter says so
        blocks = tl.minimum(pos // BLK + 1, splits)  # a free slot's old position may lie past the width
        counter = count_ptr + m * NKV + g
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == blocks - 1:
            tl.store(counter, 0)  # ready for the next launch
            _combine_blocks(part, blocks, out_ptr + m * NH * HD, g, rows, r, ok, REP, HD, BH)


@triton.jit
def _combine_blocks(part, blocks, out_ptr, g, rows, r, ok, REP: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr):
    """Key/value head `g`'s softmax states of `blocks` blocks of positions (`part` `[blocks, REP, HD + 2]`:
    output sums, max, sum), combined in block order; its query heads' outputs to `out_ptr` (a row's
    `[NH * HD]`). Read from the L2 (.cg): other programs of the launch wrote them."""
    best = tl.full([REP], float("-inf"), dtype=tl.float32)
    total = tl.zeros([REP], dtype=tl.float32)
    acc1 = tl.zeros([REP, BH], dtype=tl.float32)
    acc2 = tl.zeros([REP, BH], dtype=tl.float32)
    for b in range(0, blocks):
        blk = part + b * REP * (HD + 2) + rows * (HD + 2)
        mx = tl.load(blk + HD, cache_modifier=".cg")
        new = tl.maximum(best, mx)
        alpha, beta = tl.exp(best - new), tl.exp(mx - new)
        total = total * alpha + tl.load(blk + HD + 1, cache_modifier=".cg") * beta
        a1 = tl.load(blk[:, None] + r[None, :], mask=ok[None, :], other=0.0, cache_modifier=".cg")
        a2 = tl.load(blk[:, None] + HD // 2 + r[None, :], mask=ok[None, :], other=0.0, cache_modifier=".cg")
        acc1 = acc1 * alpha[:, None] + a1 * beta[:, None]
        acc2 = acc2 * alpha[:, None] + a2 * beta[:, None]
        best = new
    _store_halves(out_ptr, g * REP + rows, HD, r, ok, acc1 / total[:, None], acc2 / total[:, None], HD)


# Positions per program of `split_attend`, and per inner block of it
SPLIT_POSITIONS = 32
SPLIT_BLOCK = 16


def split_attend(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, inv_freq: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor, heads: int,
                 eps: float, width: int) -> torch.Tensor:
    """`rope_attend` for long caches (the talker's), rows in distinct slots at positions below `width`: each
    program takes one row's key/value head over SPLIT_POSITIONS positions (flash decoding), and the last of
    a row's programs to finish combines their softmax states, so it is one launch where the cache write and
    SDPA were two. A row whose position lies past `width` (a free slot's stale one) gets an output over
    `[0, width)` and stores no key/value."""
    m = qkv.shape[0]
    kv_heads, hd = k_cache.shape[1], k_cache.shape[-1]
    rep = heads // kv_heads
    assert qkv.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert m * kv_heads <= MAX_TILES and width <= k_cache.shape[2]
    splits = triton.cdiv(width, SPLIT_POSITIONS)
    out = torch.empty(m, heads * hd, dtype=qkv.dtype, device=qkv.device)
    part = torch.empty(m, kv_heads, splits, rep, hd + 2, dtype=torch.float32, device=qkv.device)
    _split_attend_kernel[(m, kv_heads, splits)](
        qkv, q_norm, k_norm, inv_freq, k_cache, v_cache, slot, pos, out, part, _tile_counters(qkv.device), width,
        qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps, hd**-0.5, NH=heads,
        NKV=kv_heads, REP=rep, HD=hd, BH=_pow2(hd // 2), BL=SPLIT_BLOCK, BLK=SPLIT_POSITIONS, num_warps=4)
    return out


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, out_ptr, stride_cs, stride_ch, stride_cl,
                             scale, NH: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr,
                             BL: tl.constexpr):
    m = tl.program_id(0)
    g = tl.program_id(1)  # key/value head; query heads g*REP .. g*REP+REP-1 share it
    r = tl.arange(0, BH)
    ok = r < HD // 2
    heads = g * REP + tl.arange(0, REP)
    q1, q2 = _norm_rope(q_ptr + m * NH * HD, q_ptr, q_ptr, 0, 0.0, heads, r, ok, HD, False)
    base = tl.load(slot_ptr + m) * stride_cs + g * stride_ch
    n = tl.load(pos_ptr + m) + 1
    best = tl.full([REP], float("-inf"), dtype=tl.float32)
    total = tl.zeros([REP], dtype=tl.float32)
    zero = tl.zeros([REP, BH], dtype=tl.float32)  # both output halves start from it
    best, total, o1, o2 = _attend(q1 * scale, q2 * scale, k_ptr, v_ptr, base, 0, n, stride_cl, r, ok, best, total,
                                  zero, zero, HD, BL)
    o1, o2 = o1 / total[:, None], o2 / total[:, None]
    _store_halves(out_ptr + m * NH * HD, heads, HD, r, ok, o1, o2, HD)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor:
    """Queries `[M, heads, hd]` over `k_cache`/`v_cache` `[slots, kv_heads, L, hd]`: row m sees positions
    `[0, pos[m]]` of slot `slot[m]` (grouped heads: query head h uses key head h // (heads / kv_heads)).
    Returns `[M, heads * hd]`. One program walks a row's keys serially: for the code predictor's short
    contexts (at most 17 positions); the talker's long ones go to SDPA (3x faster at 200 positions)."""
    m, heads, hd = q.shape
    kv_heads = k_cache.shape[1]
    assert q.is_contiguous() and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    out = torch.empty(m, heads * hd, dtype=q.dtype, device=q.device)
    _decode_attention_kernel[(m, kv_heads)](
        q, k_cache, v_cache, slot, pos, out, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5,
        NH=heads, REP=heads // kv_heads, HD=hd, BH=_pow2(hd // 2), BL=16, num_warps=1)
    return out

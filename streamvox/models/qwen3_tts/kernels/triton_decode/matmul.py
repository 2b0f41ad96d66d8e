"""The decode layer's GEMMs (`linear`), with the RMSNorm, SwiGLU, bias and residual fused into them, and the
greedy choices made between the code predictor's passes.

A few rows read each weight once, so a GEMM is fast when enough programs keep enough bytes in flight
(`_linear_config`): for one row, output tiles of 2..8 columns over the whole of K, summed
without tensor cores; for more rows, tl.dot tiles with narrow outputs splitting the reduction over K
across programs, the last program of a tile adding the partial sums in a fixed order, so results do not
vary from launch to launch. Between code
predictor passes, `linear(select=...)` picks the greedy id from the head's scores and looks up its
embedding in the GEMM that projects it, adding that embedding to the frame's sum (`select_rows` does the
same without a projection); `choose_commit` ends the frame step (codebook 0's greedy choice and the
per-row state) in one launch. Each launch saved is worth about a microsecond at one row (H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def pow2(n: int) -> int:
    """The least power of two at or above `n` (1 for n <= 1): a block size."""
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
        bn = min(max(pow2(-(-n // 1024)), 2), 8)
        return pow2(m), bn, min(pow2(k), 1024 if swiglu else 2048), 4, 2, 1, False
    bm = min(max(pow2(m), 16), 64)
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


def tile_counters(device: torch.device) -> torch.Tensor:
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
        counters = tile_counters(x.device)
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

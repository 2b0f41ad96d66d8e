"""The decode layer's attention: head norms, RoPE and the cache write (`qk_norm_rope_store`), attention over
a row's cache slot (`decode_attention`), and both in one launch (`rope_attend`, `split_attend`).

`rope_attend` does the two when no two rows share a cache slot (the code predictor's
single-position passes), the new key and value kept in registers; one program walks a row's keys, which
suits the predictor's <= 17 positions only (at 200 positions it took 21 us, the cache write and SDPA 8).
`split_attend` does the same for the talker's long caches, its programs each over a block of positions,
the last of a row's to finish combining their softmax states (flash decoding in one launch); with many rows
the talker attends with the cache write and SDPA instead (`Qwen3Settings.split_attend_max_rows`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from streamvox.models.qwen3_tts.kernels.triton_decode.matmul import MAX_TILES, pow2, tile_counters


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
        k_cache.stride(1), k_cache.stride(2), eps, NH=heads, NKV=kv_heads, HD=hd, BH=pow2(hd // 2), num_warps=1)
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
        BH=pow2(hd // 2), BL=bl, num_warps=warps)
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
        qkv, q_norm, k_norm, inv_freq, k_cache, v_cache, slot, pos, out, part, tile_counters(qkv.device), width,
        qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps, hd**-0.5, NH=heads,
        NKV=kv_heads, REP=rep, HD=hd, BH=pow2(hd // 2), BL=SPLIT_BLOCK, BLK=SPLIT_POSITIONS, num_warps=4)
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
        NH=heads, REP=heads // kv_heads, HD=hd, BH=pow2(hd // 2), BL=16, num_warps=1)
    return out

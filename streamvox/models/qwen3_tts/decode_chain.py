"""Decoder layers of one row as one launch of dependent phases: the code predictor's single-position
passes (`PredictorChain`) and the talker's layers (`TalkerChain`).

At one row a decoder layer is five or six kernels of a few microseconds each (`decode_kernels`: q/k/v,
attention, output projection, gate/up, down), and most of each kernel's time is its start: the launch,
the first weight bytes arriving from memory, the last program draining. Here a whole stack (or, for the
code predictor, passes 1 .. G-2 with their codebook heads and the select GEMMs between them) runs in one
launch whose programs are those kernels' programs in order, each phase's programs waiting (spinning on a
counter) until the previous phase's programs have all counted themselves done. A GEMM program loads its
first block of weights before it waits, so the next phase's weights stream while the current one computes.

Programs take a ticket from a counter as they start and act as the program of that number, so a program
only ever waits for programs that started before it: there is no deadlock however the hardware schedules
them. Every phase's programs run after all of the previous phase's finished, so phases may reuse buffers
(the residual stream `h` is updated in place). The arithmetic is `decode_kernels`': its one-row GEMM
(float32 sums over the same K blocks), `rope_attend` for the predictor's short cache, and for the talker's
long one the same attention split over blocks of positions and combined (flash decoding);
`tests/decode_kernels_job.py` compares the chains with the per-layer kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from streamvox.models.qwen3_tts import decode_kernels as dk

# a layer's row of the weight-pointer table (the kernels read its fields by position)
_LAYER_FIELDS = ("w_ln", "w_qkv", "w_qn", "w_kn", "w_o", "w_ln2", "w_gu", "w_down")
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
# weights one GEMM program holds in registers while it waits (its first K block)
MAX_TILE = 8192


@triton.jit
def _ptr(table, i, DT: tl.constexpr):
    """Pointer `i` of an address table (torch allocations are 16-byte aligned: vector loads)."""
    return tl.multiple_of(tl.load(table + i).to(tl.pointer_type(DT)), 16)


@triton.jit
def _wait(counter_ptr, n):
    """Spin until `n` programs have counted themselves done at `counter_ptr`, then acquire their writes."""
    c = tl.load(counter_ptr, volatile=True)
    while c < n:
        c = tl.load(counter_ptr, volatile=True)
    tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _signal(counter_ptr):
    tl.debug_barrier()  # every thread's stores are done before the count says so
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _weights(rows, kk, n_ok, K: tl.constexpr, up, SWIGLU: tl.constexpr):
    """Weight block `[BN, BK]` at row pointers `rows` `[BN, 1]`, columns `kk`; for SwiGLU also the up rows
    `up` elements further on (else the same block twice)."""
    mask = n_ok[:, None] & (kk < K)[None, :]
    w = tl.load(rows + kk[None, :], mask=mask, other=0.0)
    u = w
    if SWIGLU:
        u = tl.load(rows + up + kk[None, :], mask=mask, other=0.0)
    return w, u


@triton.jit
def _gemv_phase(b, w_ptr, x_ptr, norm_ptr, res_ptr, bias_ptr, out_ptr, wait_ptr, wait_n, N: tl.constexpr,
                K: tl.constexpr, eps, sel_ptr, tok_ptr, V, NORM: tl.constexpr, SWIGLU: tl.constexpr,
                RESIDUAL: tl.constexpr, BIAS: tl.constexpr, SELECT: tl.constexpr, IEEE: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """`decode_kernels.linear` of one row `x_ptr` `[K]` for output tile `b`, in K blocks of BK: the first
    block's weights (and for SwiGLU its up rows, `N` further on) loaded, then the wait for the previous
    phase. SELECT: x is a table, its row the argmax of the scores `sel_ptr` `[V]`, stored by tile 0 at
    `tok_ptr`."""
    rm = tl.arange(0, 1)
    rn = b * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    n_ok = rn < N
    rows = w_ptr + rn[:, None] * K
    w, u = _weights(rows, rk, n_ok, K, N * K, SWIGLU)
    _wait(wait_ptr, wait_n)
    if SELECT:
        tok = tl.sum(dk._argmax_rows(sel_ptr, rm, rm < 1, 0, V, 1, BV)).to(tl.int64)
        if b == 0:
            tl.store(tok_ptr, tok)
        x_ptr += tok * K
    inv = tl.zeros([1], dtype=tl.float32)
    if NORM:
        sq = tl.zeros([1], dtype=tl.float32)
        for k0 in tl.static_range(0, K, BK):
            xk = tl.load(x_ptr + k0 + rk[None, :], mask=(k0 + rk < K)[None, :], other=0.0,
                         cache_modifier=".cg").to(tl.float32)
            sq += tl.sum(xk * xk, axis=1)
        inv = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros([1, BN], dtype=tl.float32)
    acc2 = tl.zeros([1, BN], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BK):
        kk = k0 + rk
        k_ok = kk < K
        if k0 > 0:
            w, u = _weights(rows, kk, n_ok, K, N * K, SWIGLU)
        xk = tl.load(x_ptr + kk[None, :], mask=k_ok[None, :], other=0.0, cache_modifier=".cg")
        if NORM:
            xk = dk._scale_norm(xk, inv, norm_ptr, kk, k_ok)
        acc = dk._mac(acc, xk, w, False, IEEE)
        if SWIGLU:
            acc2 = dk._mac(acc2, xk, u, False, IEEE)
    dk._linear_epilogue(acc, acc2, rm, rn, n_ok[None, :], n_ok, x_ptr, bias_ptr, res_ptr, out_ptr, 0, 0, SWIGLU,
                        RESIDUAL, BIAS)


@triton.jit
def _attend_split(g, s, pos, src, qn_ptr, kn_ptr, inv_freq_ptr, k_ptr, v_ptr, part_ptr, max_splits, stride_ch,
                  stride_cl, eps, scale, NH: tl.constexpr, NKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr,
                  BH: tl.constexpr, BL: tl.constexpr, BLK: tl.constexpr):
    """Key/value head `g`'s query heads over positions `[s * BLK, (s + 1) * BLK)` of `[0, pos]` (cache slot
    0): the softmax state (max, sum, output sums) to `part_ptr` `[NKV, max_splits, REP, HD + 2]`. The block
    holding `pos` takes the new key and value from registers and stores them in the cache."""
    lo = s * BLK
    if lo <= pos:
        r = tl.arange(0, BH)
        ok = r < HD // 2
        best, total, acc1, acc2 = dk._rope_attend_span(g, 0, pos, lo, lo + BLK, src, qn_ptr, kn_ptr, inv_freq_ptr,
                                                       k_ptr, v_ptr, 0, stride_ch, stride_cl, eps, scale, NH, NKV,
                                                       REP, HD, BH, BL)
        part = part_ptr + (g * max_splits + s) * REP * (HD + 2)
        rows = tl.arange(0, REP)
        dk._store_halves(part, rows, HD + 2, r, ok, acc1, acc2, HD)
        tl.store(part + rows * (HD + 2) + HD, best)
        tl.store(part + rows * (HD + 2) + HD + 1, total)


@triton.jit
def _combine(g, pos, part_ptr, out_ptr, max_splits, REP: tl.constexpr, HD: tl.constexpr, BH: tl.constexpr,
             BLK: tl.constexpr):
    """Key/value head `g`'s query heads: their split softmax states over `[0, pos]` combined, the outputs
    to `out_ptr` (the row's `[NH * HD]`)."""
    r = tl.arange(0, BH)
    ok = r < HD // 2
    rows = tl.arange(0, REP)
    best = tl.full([REP], float("-inf"), dtype=tl.float32)
    total = tl.zeros([REP], dtype=tl.float32)
    acc1 = tl.zeros([REP, BH], dtype=tl.float32)
    acc2 = tl.zeros([REP, BH], dtype=tl.float32)
    for s in range(0, pos // BLK + 1):
        part = part_ptr + (g * max_splits + s) * REP * (HD + 2)
        m = tl.load(part + rows * (HD + 2) + HD, cache_modifier=".cg")
        t = tl.load(part + rows * (HD + 2) + HD + 1, cache_modifier=".cg")
        offs = part + rows[:, None] * (HD + 2) + r[None, :]
        a1 = tl.load(offs, mask=ok[None, :], other=0.0, cache_modifier=".cg")
        a2 = tl.load(offs + HD // 2, mask=ok[None, :], other=0.0, cache_modifier=".cg")
        new = tl.maximum(best, m)
        alpha, beta = tl.exp(best - new), tl.exp(m - new)
        total = total * alpha + t * beta
        acc1 = acc1 * alpha[:, None] + a1 * beta[:, None]
        acc2 = acc2 * alpha[:, None] + a2 * beta[:, None]
        best = new
    dk._store_halves(out_ptr, g * REP + rows, HD, r, ok, acc1 / total[:, None], acc2 / total[:, None], HD)


@triton.jit
def _layer(q, i, phase, first_n, pos, h_ptr, qkv_ptr, attn_ptr, mlp_ptr, part_ptr, sync_ptr, wl, inv_freq_ptr,
           k_ptr, v_ptr, stride_ch, stride_cl, splits, max_splits, eps, scale, DT: tl.constexpr, H: tl.constexpr,
           NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, INTER: tl.constexpr, SPLIT: tl.constexpr,
           QB: tl.constexpr, OB: tl.constexpr, GB: tl.constexpr, DB: tl.constexpr, BN_QKV: tl.constexpr,
           BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr, BN_GU: tl.constexpr,
           BK_GU: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr,
           BLK: tl.constexpr, IEEE: tl.constexpr):
    """Program `q` of layer `i` (weights at address-table row `wl`), the layer's first phase numbered
    `phase` and waiting for `first_n` programs; returns the program's phase. Phases: q/k/v (QB programs);
    attention (NKV x splits: `rope_attend`, or with SPLIT `_attend_split`); with SPLIT, the combine (NKV);
    output projection (OB); gate/up (GB); down (DB)."""
    NQKV: tl.constexpr = (NH + 2 * NKV) * HD
    XP: tl.constexpr = 1 if SPLIT else 0  # the combine phase
    AB = NKV * splits
    CB = NKV * XP
    if q < QB:  # input norm, q/k/v
        _gemv_phase(q, _ptr(wl, 1, DT), h_ptr, _ptr(wl, 0, DT), h_ptr, h_ptr, qkv_ptr, sync_ptr + phase, first_n,
                    NQKV, H, eps, h_ptr, h_ptr, 0, True, False, False, False, False, IEEE, BN_QKV, BK_QKV, 1)
    elif q < QB + AB:  # q/k norms, RoPE, cache write, attention
        phase += 1
        _wait(sync_ptr + phase, QB)
        a = q - QB
        if SPLIT:
            _attend_split(a // splits, a % splits, pos, qkv_ptr, _ptr(wl, 2, DT), _ptr(wl, 3, DT), inv_freq_ptr,
                          k_ptr, v_ptr, part_ptr, max_splits, stride_ch, stride_cl, eps, scale, NH, NKV, NH // NKV,
                          HD, BH, BL, BLK)
        else:
            dk._rope_attend_row(a, 0, pos, qkv_ptr, _ptr(wl, 2, DT), _ptr(wl, 3, DT), inv_freq_ptr, k_ptr, v_ptr,
                                attn_ptr, 0, stride_ch, stride_cl, eps, scale, NH, NKV, NH // NKV, HD, BH, BL)
    elif q < QB + AB + CB:  # the split attention combined
        phase += 2
        _wait(sync_ptr + phase, AB)
        _combine(q - QB - AB, pos, part_ptr, attn_ptr, max_splits, NH // NKV, HD, BH, BLK)
    elif q < QB + AB + CB + OB:  # output projection + residual
        phase += 2 + XP
        _gemv_phase(q - QB - AB - CB, _ptr(wl, 4, DT), attn_ptr, h_ptr, h_ptr, h_ptr, h_ptr, sync_ptr + phase, NKV,
                    H, NH * HD, eps, h_ptr, h_ptr, 0, False, False, True, False, False, IEEE, BN_O, BK_O, 1)
    elif q < QB + AB + CB + OB + GB:  # post-attention norm, gate/up, SwiGLU
        phase += 3 + XP
        _gemv_phase(q - QB - AB - CB - OB, _ptr(wl, 6, DT), h_ptr, _ptr(wl, 5, DT), h_ptr, h_ptr, mlp_ptr,
                    sync_ptr + phase, OB, INTER, H, eps, h_ptr, h_ptr, 0, True, True, False, False, False, IEEE,
                    BN_GU, BK_GU, 1)
    else:  # down + residual
        phase += 4 + XP
        _gemv_phase(q - QB - AB - CB - OB - GB, _ptr(wl, 7, DT), mlp_ptr, h_ptr, h_ptr, h_ptr, h_ptr,
                    sync_ptr + phase, GB, H, INTER, eps, h_ptr, h_ptr, 0, False, False, True, False, False, IEEE,
                    BN_D, BK_D, 1)
    return phase


@triton.jit
def _predictor_kernel(h_ptr, qkv_ptr, attn_ptr, mlp_ptr, scores_ptr, sync_ptr, wtab, ptab, norm_ptr, proj_w, proj_b,
                      inv_freq_ptr, pk_ptr, pv_ptr, tok_ptr, stride_layer, stride_ch, stride_cl, eps, norm_eps,
                      scale, DT: tl.constexpr, H: tl.constexpr, TH: tl.constexpr, V: tl.constexpr,
                      NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, INTER: tl.constexpr,
                      LAYERS: tl.constexpr, J0: tl.constexpr, QB: tl.constexpr, OB: tl.constexpr,
                      GB: tl.constexpr, DB: tl.constexpr, HB: tl.constexpr, SB: tl.constexpr,
                      BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
                      BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
                      BN_HEAD: tl.constexpr, BK_HEAD: tl.constexpr, BN_SEL: tl.constexpr, BK_SEL: tl.constexpr,
                      BH: tl.constexpr, BL: tl.constexpr, BV: tl.constexpr, IEEE: tl.constexpr):
    LB: tl.constexpr = QB + NKV + OB + GB + DB  # programs per layer
    PB: tl.constexpr = LAYERS * LB + HB + SB  # programs per pass
    PH: tl.constexpr = 5 * LAYERS + 2  # phases per pass
    # Phase k's done counter is sync[1 + k]; it waits on sync[k] (phase 0 on the ticket counter, for 0).
    t = tl.atomic_add(sync_ptr, 1)  # every lower ticket is a program that has started
    p = t // PB
    r = t - p * PB
    pos = J0 + 1 + p  # pass J0 + p writes cache position J0 + 1 + p (pass 0 wrote positions 0 and 1)
    if r < LAYERS * LB:
        i = r // LB
        phase = _layer(r - i * LB, i, p * PH + i * 5, tl.where(i > 0, DB, tl.where(p > 0, SB, 0)), pos, h_ptr,
                       qkv_ptr, attn_ptr, mlp_ptr, scores_ptr, sync_ptr, wtab + i * 8, inv_freq_ptr,
                       pk_ptr + i * stride_layer, pv_ptr + i * stride_layer, stride_ch, stride_cl, 1, 1, eps, scale,
                       DT, H, NH, NKV, HD, INTER, False, QB, OB, GB, DB, BN_QKV, BK_QKV, BN_O, BK_O, BN_GU, BK_GU,
                       BN_D, BK_D, BH, BL, 1, IEEE)
    elif r < LAYERS * LB + HB:  # final norm, the codebook head's scores
        phase = p * PH + 5 * LAYERS
        _gemv_phase(r - LAYERS * LB, _ptr(ptab, 2 * p, DT), h_ptr, norm_ptr, h_ptr, h_ptr, scores_ptr,
                    sync_ptr + phase, DB, V, H, norm_eps, scores_ptr, tok_ptr, V, True, False, False, False, False,
                    IEEE, BN_HEAD, BK_HEAD, BV)
    else:  # the greedy id, its embedding, projected: the next pass's input
        phase = p * PH + 5 * LAYERS + 1
        _gemv_phase(r - LAYERS * LB - HB, proj_w, _ptr(ptab, 2 * p + 1, DT), h_ptr, h_ptr, proj_b, h_ptr,
                    sync_ptr + phase, HB, H, TH, eps, scores_ptr, tok_ptr + J0 + 1 + p, V, False, False, False, True,
                    True, IEEE, BN_SEL, BK_SEL, BV)
    _signal(sync_ptr + 1 + phase)


@triton.jit
def _talker_kernel(h_ptr, qkv_ptr, attn_ptr, mlp_ptr, part_ptr, sync_ptr, wtab, inv_freq_ptr, k_ptr, v_ptr, pos_ptr,
                   stride_layer, stride_ch, stride_cl, splits, max_splits, eps, scale, DT: tl.constexpr,
                   H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, INTER: tl.constexpr,
                   QB: tl.constexpr, OB: tl.constexpr, GB: tl.constexpr, DB: tl.constexpr, BN_QKV: tl.constexpr,
                   BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr, BN_GU: tl.constexpr,
                   BK_GU: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr,
                   BLK: tl.constexpr, IEEE: tl.constexpr):
    lb = QB + NKV * splits + NKV + OB + GB + DB  # programs per layer
    # Phase k's done counter is sync[1 + k]; it waits on sync[k] (phase 0 on the ticket counter, for 0).
    t = tl.atomic_add(sync_ptr, 1)  # every lower ticket is a program that has started
    i = t // lb
    phase = _layer(t - i * lb, i, i * 6, tl.where(i > 0, DB, 0), tl.load(pos_ptr), h_ptr, qkv_ptr, attn_ptr,
                   mlp_ptr, part_ptr, sync_ptr, wtab + i * 8, inv_freq_ptr, k_ptr + i * stride_layer,
                   v_ptr + i * stride_layer, stride_ch, stride_cl, splits, max_splits, eps, scale, DT, H, NH, NKV,
                   HD, INTER, True, QB, OB, GB, DB, BN_QKV, BK_QKV, BN_O, BK_O, BN_GU, BK_GU, BN_D, BK_D, BH, BL,
                   BLK, IEEE)
    _signal(sync_ptr + 1 + phase)


def _tile(n: int, k: int, swiglu: bool, element_size: int, widen: int = 1) -> tuple[int, int]:
    """(BN, BK) for a one-row `[1, k] x [k, n]` product: `decode_kernels.linear`'s one-row tile (K blocks
    halved in float32, as there; BN times `widen`, for tuning), narrowed until its first K block's weights
    fit MAX_TILE."""
    _, bn, bk, *_ = dk._linear_config(1, n, k, swiglu)
    if element_size == 4:
        bk //= 2
    fit = max(MAX_TILE // (bk * (2 if swiglu else 1)), 1)
    return min(bn * widen, fit), bk


class _Chain:
    """What both chains share: the stack's weights as an address table, the one-row buffers, the layer
    tiles, and the launch's counters (`sync`: a ticket counter, then one done counter per phase)."""

    def __init__(self, stack, num_warps: int | None, widen: int) -> None:
        self.stack = stack
        w = stack.layers[0]["w_qkv"]
        self.dtype, self.device = w.dtype, w.device
        tensors = [p[k] for p in stack.layers for k in _LAYER_FIELDS]
        assert all(t.is_contiguous() and t.dtype == self.dtype for t in tensors)
        self.wtab = self._table(tensors)
        nh, nkv, hd, inter = stack.nh, stack.nkv, stack.hd, stack.inter
        h = w.shape[1]
        self.hidden = h
        self.nqkv = (nh + 2 * nkv) * hd
        self.element_size, self.widen = w.element_size(), widen
        tiles = {"QKV": self.tile(self.nqkv, h), "O": self.tile(h, nh * hd), "GU": self.tile(inter, h, True),
                 "D": self.tile(h, inter)}
        self.tiles = {}  # the kernels' BN_QKV, BK_QKV, BN_O, ...
        for name, (bn, bk) in tiles.items():
            self.tiles |= {f"BN_{name}": bn, f"BK_{name}": bk}
        c = triton.cdiv
        self.counts = dict(QB=c(self.nqkv, tiles["QKV"][0]), OB=c(h, tiles["O"][0]), GB=c(inter, tiles["GU"][0]),
                           DB=c(h, tiles["D"][0]))
        block, warps = dk._attend_config(1)
        self.block, self.num_warps = block, num_warps or warps
        dev = self.device
        self.qkv = torch.empty(1, self.nqkv, dtype=self.dtype, device=dev)
        self.attn = torch.empty(1, nh * hd, dtype=self.dtype, device=dev)
        self.mlp = torch.empty(1, inter, dtype=self.dtype, device=dev)

    def tile(self, n: int, k: int, swiglu: bool = False) -> tuple[int, int]:
        """(BN, BK) of this chain's `[1, k] x [k, n]` products."""
        return _tile(n, k, swiglu, self.element_size, self.widen)

    def _table(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)

    def _layer_phases(self, attention: list[int]) -> list[int]:
        """Programs per phase of one layer, with `attention` the attention phases' program counts."""
        n = self.counts
        return [n["QB"], *attention, n["OB"], n["GB"], n["DB"]]

    def _shape_args(self) -> dict:
        s = self.stack
        return dict(DT=_TL_DTYPES[self.dtype], H=self.hidden, NH=s.nh, NKV=s.nkv, HD=s.hd, INTER=s.inter,
                    BH=dk._pow2(s.hd // 2), BL=self.block, IEEE=self.dtype == torch.float32,
                    num_warps=self.num_warps, **self.counts, **self.tiles)


class PredictorChain(_Chain):
    """Passes `1 .. G-2` of the code predictor for row 0 (cache slot 0), after pass 0 ran per layer:
    `chain(h, frames)` takes pass 1's input `h` `[1, H]` (updated in place) and writes `frames[0, 2:]`.
    `widen`, `num_warps`: wider output tiles and another warp count than the per-layer kernels' (tuning)."""

    def __init__(self, stack, predictor: torch.nn.Module, pk: torch.Tensor, pv: torch.Tensor, widen: int = 1,
                 num_warps: int | None = None) -> None:
        super().__init__(stack, num_warps, widen)
        self.proj, self.pk, self.pv = predictor.small_to_mtp_projection, pk, pv
        self.talker_hidden = self.proj.weight.shape[1]
        self.vocab = predictor.lm_head[0].weight.shape[0]
        self.groups = len(predictor.lm_head) + 1
        passes = range(1, self.groups - 1)
        tables = [t for j in passes for t in (predictor.lm_head[j].weight, predictor.model.codec_embedding[j].weight)]
        assert all(t.is_contiguous() and t.dtype == self.dtype for t in tables + [self.proj.weight])
        self.ptab = self._table(tables)
        h, v = self.hidden, self.vocab
        (bn_head, bk_head), (bn_sel, bk_sel) = self.tile(v, h), self.tile(h, self.talker_hidden)
        self.tiles.update(BN_HEAD=bn_head, BK_HEAD=bk_head, BN_SEL=bn_sel, BK_SEL=bk_sel)
        self.counts.update(HB=triton.cdiv(v, bn_head), SB=triton.cdiv(h, bn_sel))
        one_pass = self._layer_phases([stack.nkv]) * len(stack.layers) + [self.counts["HB"], self.counts["SB"]]
        self._phases = (one_pass * len(passes))[:-1]  # the last pass ends at its head
        self.programs = sum(self._phases)
        self.sync = torch.zeros(1 + len(self._phases), dtype=torch.int32, device=self.device)
        self.scores = torch.empty(1, v, dtype=torch.float32, device=self.device)

    def phase_programs(self) -> list[int]:
        """Programs per phase, in launch order: what each phase's done counter reaches."""
        return list(self._phases)

    def __call__(self, h: torch.Tensor, frames: torch.Tensor) -> None:
        s, pk, pv = self.stack, self.pk, self.pv
        assert h.shape == (1, self.hidden) and h.is_contiguous() and pk.stride() == pv.stride()
        self.sync.zero_()
        _predictor_kernel[(self.programs,)](
            h, self.qkv, self.attn, self.mlp, self.scores, self.sync, self.wtab, self.ptab, s.norm_w,
            self.proj.weight, self.proj.bias, s.inv_freq, pk, pv, frames, pk.stride(0), pk.stride(2), pk.stride(3),
            s.eps, s.norm_eps, s.hd**-0.5, TH=self.talker_hidden, V=self.vocab, LAYERS=len(s.layers), J0=1, BV=256,
            **self._shape_args())
        frames[:, -1] = self.scores.argmax(-1)


class TalkerChain(_Chain):
    """The talker's layers for row 0 (KV-cache slot 0) at position `pos[0]`: `chain(h, pos, width)` takes
    the step's input `h` `[1, H]` and leaves the last layer's output in it; attention in blocks of `block`
    positions over `[0, pos]` (`width` >= pos + 1: the step's attention width, which fixes the grid)."""

    def __init__(self, stack, k_cache: torch.Tensor, v_cache: torch.Tensor, positions_per_split: int = 64,
                 widen: int = 1, num_warps: int | None = None) -> None:
        super().__init__(stack, num_warps, widen)
        self.k, self.v, self.split = k_cache, v_cache, positions_per_split
        self.max_splits = triton.cdiv(k_cache.shape[3], positions_per_split)
        rep = stack.nh // stack.nkv
        self.part = torch.empty(stack.nkv, self.max_splits, rep, stack.hd + 2, dtype=torch.float32,
                                device=self.device)
        self.sync = torch.zeros(1 + 6 * len(stack.layers), dtype=torch.int32, device=self.device)

    def phase_programs(self, width: int) -> list[int]:
        """Programs per phase at attention width `width`, in launch order."""
        nkv = self.stack.nkv
        return self._layer_phases([nkv * triton.cdiv(width, self.split), nkv]) * len(self.stack.layers)

    def __call__(self, h: torch.Tensor, pos: torch.Tensor, width: int) -> None:
        s, k, v = self.stack, self.k, self.v
        assert h.shape == (1, self.hidden) and h.is_contiguous() and k.stride() == v.stride()
        assert width <= k.shape[3]
        self.sync.zero_()
        _talker_kernel[(sum(self.phase_programs(width)),)](
            h, self.qkv, self.attn, self.mlp, self.part, self.sync, self.wtab, s.inv_freq, k, v, pos, k.stride(0),
            k.stride(2), k.stride(3), triton.cdiv(width, self.split), self.max_splits, s.eps, s.hd**-0.5,
            BLK=self.split, **self._shape_args())

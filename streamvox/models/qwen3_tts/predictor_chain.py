"""The code predictor's single-position passes for one row, as one launch of dependent phases.

At one row a predictor pass is ~27 kernels of a few microseconds each (per layer: q/k/v, `rope_attend`,
output projection, gate/up, down; then the codebook head and the select GEMM that embeds its greedy id
for the next pass), and most of each kernel's time is its start: the launch, the first weight bytes
arriving from memory, the last program draining. Here passes 1 .. G-2 run in one launch whose programs
are those kernels' programs in order, each phase's programs waiting (spinning on a counter) until the
previous phase's programs have all counted themselves done. A GEMM program loads its weight tile before
it waits, so the next phase's weights stream while the current phase computes.

Programs take a ticket from a counter as they start and act as the program of that number, so a program
only ever waits for programs that started before it: there is no deadlock however the hardware schedules
them. Every phase's programs run after all of the previous phase's finished, so phases may reuse buffers
(the residual stream `h` is updated in place). The arithmetic is `decode_kernels`' one-row GEMM
(float32 sums, whole-K tiles), `rope_attend` and the select GEMM's argmax; `tests/decode_kernels_job.py`
compares the chain with them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from streamvox.models.qwen3_tts import decode_kernels as dk

# a layer's row of the weight-pointer table (the kernel reads its fields by position)
_LAYER_FIELDS = ("w_ln", "w_qkv", "w_qn", "w_kn", "w_o", "w_ln2", "w_gu", "w_down")
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


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
def _gemv_phase(b, w_ptr, x_ptr, norm_ptr, res_ptr, bias_ptr, out_ptr, wait_ptr, wait_n, N, K, eps, sel_ptr, tok_ptr,
                V, NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr,
                SELECT: tl.constexpr, IEEE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """`decode_kernels.linear` of one row `x_ptr` `[K]` for output tile `b`: its weights `[BN, BK]` (and
    for SwiGLU its up rows, `N` further on) loaded, then the wait for the previous phase. SELECT: x is a
    table, its row the argmax of the scores `sel_ptr` `[V]`, which tile 0 stores at `tok_ptr`."""
    rm = tl.arange(0, 1)
    rn = b * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    n_ok = rn < N
    k_ok = rk < K
    mask = n_ok[:, None] & k_ok[None, :]
    w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=mask, other=0.0)
    u = w
    if SWIGLU:
        u = tl.load(w_ptr + (rn + N)[:, None] * K + rk[None, :], mask=mask, other=0.0)
    _wait(wait_ptr, wait_n)
    if SELECT:
        tok = tl.sum(dk._argmax_rows(sel_ptr, rm, rm < 1, 0, V, 1, BV)).to(tl.int64)
        if b == 0:
            tl.store(tok_ptr, tok)
        x_ptr += tok * K
    x = tl.load(x_ptr + rk[None, :], mask=k_ok[None, :], other=0.0, cache_modifier=".cg")
    if NORM:
        xf = x.to(tl.float32)
        x = dk._scale_norm(x, 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / K + eps), norm_ptr, rk, k_ok)
    acc = dk._mac(tl.zeros([1, BN], dtype=tl.float32), x, w, False, IEEE)
    acc2 = acc
    if SWIGLU:
        acc2 = dk._mac(tl.zeros([1, BN], dtype=tl.float32), x, u, False, IEEE)
    dk._linear_epilogue(acc, acc2, rm, rn, n_ok[None, :], n_ok, x_ptr, bias_ptr, res_ptr, out_ptr, 0, 0, SWIGLU,
                        RESIDUAL, BIAS)


@triton.jit
def _chain_kernel(h_ptr, qkv_ptr, attn_ptr, mlp_ptr, scores_ptr, sync_ptr, wtab, ptab, norm_ptr, proj_w, proj_b,
                  inv_freq_ptr, pk_ptr, pv_ptr, tok_ptr, stride_layer, stride_ch, stride_cl, eps, norm_eps, scale,
                  DT: tl.constexpr, H: tl.constexpr, TH: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                  NKV: tl.constexpr, HD: tl.constexpr, INTER: tl.constexpr, LAYERS: tl.constexpr, J0: tl.constexpr,
                  BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr,
                  BN_HEAD: tl.constexpr, BN_SEL: tl.constexpr, BK_H: tl.constexpr, BK_O: tl.constexpr,
                  BK_D: tl.constexpr, BK_SEL: tl.constexpr, BH: tl.constexpr, BL: tl.constexpr, BV: tl.constexpr,
                  IEEE: tl.constexpr):
    NQKV: tl.constexpr = (NH + 2 * NKV) * HD
    QB: tl.constexpr = (NQKV + BN_QKV - 1) // BN_QKV  # programs per phase
    OB: tl.constexpr = (H + BN_O - 1) // BN_O
    GB: tl.constexpr = (INTER + BN_GU - 1) // BN_GU
    DB: tl.constexpr = (H + BN_D - 1) // BN_D
    HB: tl.constexpr = (V + BN_HEAD - 1) // BN_HEAD
    SB: tl.constexpr = (H + BN_SEL - 1) // BN_SEL
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
        q = r - i * LB
        wl = wtab + i * 8
        phase = p * PH + i * 5
        if q < QB:  # input norm, q/k/v
            _gemv_phase(q, _ptr(wl, 1, DT), h_ptr, _ptr(wl, 0, DT), h_ptr, h_ptr, qkv_ptr, sync_ptr + phase,
                        tl.where(i > 0, DB, tl.where(p > 0, SB, 0)), NQKV, H, eps, scores_ptr, tok_ptr, V, True,
                        False, False, False, False, IEEE, BN_QKV, BK_H, BV)
        elif q < QB + NKV:  # q/k norms, RoPE, cache write, attention
            phase += 1
            _wait(sync_ptr + phase, QB)
            dk._rope_attend_row(q - QB, 0, pos, qkv_ptr, _ptr(wl, 2, DT), _ptr(wl, 3, DT), inv_freq_ptr,
                                pk_ptr + i * stride_layer, pv_ptr + i * stride_layer, attn_ptr, 0, stride_ch,
                                stride_cl, eps, scale, NH, NKV, NH // NKV, HD, BH, BL)
        elif q < QB + NKV + OB:  # output projection + residual
            phase += 2
            _gemv_phase(q - QB - NKV, _ptr(wl, 4, DT), attn_ptr, h_ptr, h_ptr, h_ptr, h_ptr, sync_ptr + phase, NKV,
                        H, NH * HD, eps, scores_ptr, tok_ptr, V, False, False, True, False, False, IEEE, BN_O, BK_O,
                        BV)
        elif q < QB + NKV + OB + GB:  # post-attention norm, gate/up, SwiGLU
            phase += 3
            _gemv_phase(q - QB - NKV - OB, _ptr(wl, 6, DT), h_ptr, _ptr(wl, 5, DT), h_ptr, h_ptr, mlp_ptr,
                        sync_ptr + phase, OB, INTER, H, eps, scores_ptr, tok_ptr, V, True, True, False, False, False,
                        IEEE, BN_GU, BK_H, BV)
        else:  # down + residual
            phase += 4
            _gemv_phase(q - QB - NKV - OB - GB, _ptr(wl, 7, DT), mlp_ptr, h_ptr, h_ptr, h_ptr, h_ptr,
                        sync_ptr + phase, GB, H, INTER, eps, scores_ptr, tok_ptr, V, False, False, True, False, False,
                        IEEE, BN_D, BK_D, BV)
    elif r < LAYERS * LB + HB:  # final norm, the codebook head's scores
        phase = p * PH + 5 * LAYERS
        _gemv_phase(r - LAYERS * LB, _ptr(ptab, 2 * p, DT), h_ptr, norm_ptr, h_ptr, h_ptr, scores_ptr,
                    sync_ptr + phase, DB, V, H, norm_eps, scores_ptr, tok_ptr, V, True, False, False, False, False,
                    IEEE, BN_HEAD, BK_H, BV)
    else:  # the greedy id, its embedding, projected: the next pass's input
        phase = p * PH + 5 * LAYERS + 1
        _gemv_phase(r - LAYERS * LB - HB, proj_w, _ptr(ptab, 2 * p + 1, DT), h_ptr, h_ptr, proj_b, h_ptr,
                    sync_ptr + phase, HB, H, TH, eps, scores_ptr, tok_ptr + J0 + 1 + p, V, False, False, False, True,
                    True, IEEE, BN_SEL, BK_SEL, BV)
    _signal(sync_ptr + 1 + phase)


def _tile_width(n: int, k: int, swiglu: bool) -> int:
    """`decode_kernels`' one-row output tile width for an `[1, k] x [k, n]` product."""
    return dk._linear_config(1, n, k, swiglu)[1]


class PredictorChain:
    """Passes `1 .. G-2` of the code predictor for row 0 (cache slot 0), after pass 0 ran per layer:
    `chain(h, frames)` takes pass 1's input `h` `[1, H]` (updated in place) and writes `frames[0, 2:]`."""

    def __init__(self, stack, predictor: torch.nn.Module, pk: torch.Tensor, pv: torch.Tensor,
                 widths: dict[str, int] | None = None, num_warps: int | None = None) -> None:
        """`widths`: output tile widths (`BN_QKV`, `BN_O`, `BN_GU`, `BN_D`, `BN_HEAD`, `BN_SEL`) in place of
        `decode_kernels`' one-row ones; `num_warps` in place of `rope_attend`'s (both for tuning)."""
        proj = predictor.small_to_mtp_projection
        layers = stack.layers
        w = layers[0]["w_qkv"]
        self.dtype, self.device = w.dtype, w.device
        self.groups = len(predictor.lm_head) + 1
        self.hidden, self.talker_hidden = proj.weight.shape
        self.vocab = predictor.lm_head[0].weight.shape[0]
        self.stack, self.proj, self.pk, self.pv = stack, proj, pk, pv
        tensors = [p[k] for p in layers for k in _LAYER_FIELDS]
        passes = range(1, self.groups - 1)
        tables = [t for j in passes for t in (predictor.lm_head[j].weight, predictor.model.codec_embedding[j].weight)]
        assert all(t.is_contiguous() and t.dtype == self.dtype for t in tensors + tables + [proj.weight])
        self.wtab = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)
        self.ptab = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=self.device)
        nh, nkv, hd, inter = stack.nh, stack.nkv, stack.hd, stack.inter
        h, th, v = self.hidden, self.talker_hidden, self.vocab
        nqkv, cdiv = (nh + 2 * nkv) * hd, triton.cdiv
        # output tile widths, and each product's whole K in one block
        self.tiles = dict(BN_QKV=_tile_width(nqkv, h, False), BN_O=_tile_width(h, nh * hd, False),
                          BN_GU=_tile_width(inter, h, True), BN_D=_tile_width(h, inter, False),
                          BN_HEAD=_tile_width(v, h, False), BN_SEL=_tile_width(h, th, False), BK_H=dk._pow2(h),
                          BK_O=dk._pow2(nh * hd), BK_D=dk._pow2(inter), BK_SEL=dk._pow2(th)) | (widths or {})
        block, warps = dk._attend_config(1)
        self.block, self.num_warps = block, num_warps or warps
        t = self.tiles
        layer = [cdiv(nqkv, t["BN_QKV"]), nkv, cdiv(h, t["BN_O"]), cdiv(inter, t["BN_GU"]), cdiv(h, t["BN_D"])]
        one_pass = layer * len(layers) + [cdiv(v, t["BN_HEAD"]), cdiv(h, t["BN_SEL"])]
        self._phases = (one_pass * len(passes))[:-1]  # the last pass ends at its head
        self.programs = sum(self._phases)
        dev = self.device
        self.sync = torch.zeros(1 + len(self._phases), dtype=torch.int32, device=dev)
        self.qkv = torch.empty(1, nqkv, dtype=self.dtype, device=dev)
        self.attn = torch.empty(1, nh * hd, dtype=self.dtype, device=dev)
        self.mlp = torch.empty(1, inter, dtype=self.dtype, device=dev)
        self.scores = torch.empty(1, v, dtype=torch.float32, device=dev)

    def phase_programs(self) -> list[int]:
        """Programs per phase, in launch order: what each phase's done counter reaches."""
        return list(self._phases)

    def __call__(self, h: torch.Tensor, frames: torch.Tensor) -> None:
        s, pk, pv = self.stack, self.pk, self.pv
        assert h.shape == (1, self.hidden) and h.is_contiguous() and pk.stride() == pv.stride()
        self.sync.zero_()
        _chain_kernel[(self.programs,)](
            h, self.qkv, self.attn, self.mlp, self.scores, self.sync, self.wtab, self.ptab, s.norm_w,
            self.proj.weight, self.proj.bias, s.inv_freq, pk, pv, frames, pk.stride(0), pk.stride(2), pk.stride(3),
            s.eps, s.norm_eps, s.hd**-0.5, DT=_TL_DTYPES[self.dtype], H=self.hidden, TH=self.talker_hidden,
            V=self.vocab, NH=s.nh, NKV=s.nkv, HD=s.hd, INTER=s.inter, LAYERS=len(s.layers), J0=1,
            BH=dk._pow2(s.hd // 2), BL=self.block, BV=256, IEEE=self.dtype == torch.float32, num_warps=self.num_warps,
            **self.tiles)
        frames[:, -1] = self.scores.argmax(-1)

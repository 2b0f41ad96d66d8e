"""Time the Triton decode kernels (streamvox/models/qwen3_tts/kernels/triton_decode/) at the 1.7B talker's and
code predictor's shapes, over a grid of launch configurations, against the torch ops they replace.

    python tools/kernel_lab/tune_decode_kernels.py [--rows 1 16 64 128] [--json-out F]

Each timing is the median of CUDA-graph replays of 20 back-to-back launches (launch cost as in the
frame step's graph), divided by 20. The launches cycle through copies of the weight, at least 256 MB of
them, so every launch reads its weight from memory, not the L2, as in the frame step (where a
predictor pass reads 160 MB of weights). Prints, per shape and row count, the best configuration, its
time, the time to read the weight once at the measured copy rate, and the torch time (cuBLAS GEMM plus
the unfused norm / SwiGLU / residual ops); one-row products sweep the narrow tiles summed without tensor
cores (GEMV_CONFIGS), others the tl.dot tiles (CONFIGS). Then `rope_attend` per block size and warp count
against the cache write + SDPA it replaces, at the predictor's and the talker's context lengths.
`--split-attend`: only the talker's `split_attend` per positions per program and inner block, against the
cache write + SDPA over the step's width masked to each row's position (as the frame step did).
`--launch-floor`: only what a launch costs in a graph with nothing to read (an empty kernel), with one
dependent 2 KB read (the previous launch's output, as a decode kernel reads its input), and each one-row
GEMM in its served configuration beside its weight-read bound. GPU only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for streamvox
from streamvox.models.qwen3_tts.kernels import triton_decode as dk  # noqa: E402
from streamvox.models.qwen3_tts.kernels.graphs import capture_graph  # noqa: E402
from streamvox.models.qwen3_tts.kernels.triton_decode import attention as dka  # noqa: E402
from streamvox.models.qwen3_tts.kernels.triton_decode import matmul as dkm  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # both stacks' attention
# (name, K, N, fusion) at the 1.7B shapes: talker hidden 2048 / intermediate 6144, predictor 1024 / 3072
SHAPES = [
    ("pred.qkv", 1024, 4096, "norm"), ("pred.o", 2048, 1024, "residual"),
    ("pred.gate_up", 1024, 6144, "swiglu"), ("pred.down", 3072, 1024, "residual"), ("pred.head", 1024, 2048, "norm"),
    ("talker.qkv", 2048, 4096, "norm"), ("talker.o", 2048, 2048, "residual"),
    ("talker.gate_up", 2048, 12288, "swiglu"), ("talker.down", 6144, 2048, "residual"),
    ("talker.codec_head", 2048, 3072, ""),
]
# BN, BK, warps, stages, split (K split over that many programs per tile): tl.dot tiles, and (up to
# dkm.GEMV_MAX_ROWS rows) the tiles summed without tensor cores
CONFIGS = [(bn, bk, 8 if bn == 64 else 4, stages, split)
           for bn, bk, stages, split in itertools.product((16, 32, 64), (128, 256), (3, 5), (1, 2, 4))]
GEMV_CONFIGS = [(bn, bk, warps, 2, split)
                for bn, bk, warps, split in itertools.product((2, 4, 8, 16), (512, 1024, 2048), (4, 8), (1, 2))]
REPEAT = 20
COLD_BYTES = 256 << 20  # weight copies cycled through per timing: more than the L2 holds


def cycle(calls):
    """One callable that makes the next of `calls` (in turn) at each call."""
    turn = itertools.cycle(list(calls))
    return lambda: next(turn)()


def per_launch_ms(fn) -> float:
    graph, _ = capture_graph(lambda: [fn() for _ in range(REPEAT)], None)
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / REPEAT)
    return sorted(times)[len(times) // 2]


def gemm_inputs(m: int, k: int, n: int, fusion: str) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Random bf16 inputs of an `[m, k] x [k, n]` product with `fusion`: copies of the weight (enough to cycle
    through COLD_BYTES), x, the norm weight, the residual, and `dk.linear`'s keyword arguments."""
    copies = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
              for _ in range(-(-COLD_BYTES // (n * k * 2)))]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    nw = torch.rand(k, dtype=torch.bfloat16, device="cuda") + 0.5
    res = torch.randn(m, n // 2 if fusion == "swiglu" else n, dtype=torch.bfloat16, device="cuda")
    kw = dict(norm=nw if fusion in ("norm", "swiglu") else None, eps=1e-6, swiglu=fusion == "swiglu",
              residual=res if fusion == "residual" else None)
    return copies, x, nw, res, kw


def torch_op(x, w, nw, fusion, res):
    if fusion == "norm":
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * nw
        return F.linear(h, w)
    if fusion == "swiglu":
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * nw
        g, u = F.linear(h, w).chunk(2, dim=-1)
        return F.silu(g) * u
    if fusion == "residual":
        return res + F.linear(x, w)
    return F.linear(x, w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--no-attention", action="store_true", help="time the GEMMs only")
    ap.add_argument("--split-attend", action="store_true", help="time the talker's split_attend only")
    ap.add_argument("--launch-floor", action="store_true", help="time empty and one-read launches, one-row GEMMs")
    ap.add_argument("--repeat", type=int, default=0,
                    help="no tuning: launch each GEMM this many times back to back (its default configuration) "
                         "and count the results bitwise equal to the first (split-K sums in a fixed order)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    # device copy rate, as gpu_bench.py --micro measures it: one 2 GiB copy, bytes read + written per second
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src)
    end.record()
    end.synchronize()
    tbps = 2 * src.numel() / (start.elapsed_time(end) / 1e3) / 1e12
    del src, dst
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; copy {tbps:.2f} TB/s (read+write)")
    print(f"# command: {' '.join(sys.argv)}")
    results = {"gpu": torch.cuda.get_device_name(), "copy_TBps": tbps, "linear": [], "attention": [], "repeat": [],
               "split_attend": [], "launch_floor": []}
    if args.launch_floor:
        results["launch_floor"] = launch_floor(tbps)
        args.rows, args.no_attention = [], True
    if args.split_attend:
        results["split_attend"] = split_attend_sweep(args.rows)
        args.rows, args.no_attention = [], True
    default_config = dkm._linear_config
    for (name, k, n, fusion), m in itertools.product(SHAPES, args.rows):
        copies, xm, nw, res, kw = gemm_inputs(m, k, n, fusion)
        w = copies[0]
        n_out = res.shape[1]
        ref = torch_op(xm, w, nw, fusion, res).float()
        got = dk.linear(xm, w, **kw).float()
        err = float((got - ref).norm() / ref.norm())
        if args.repeat:
            outs = [dk.linear(xm, w, **kw) for _ in range(args.repeat)]
            same = sum(torch.equal(o, outs[0]) for o in outs)
            results["repeat"].append(dict(name=name, m=m, config=default_config(m, n_out, k, fusion == "swiglu"),
                                          identical=same, launches=args.repeat, rel_err=err))
            print(f"{name:18s} m={m:4d}: {same}/{args.repeat} launches identical to the first, "
                  f"config {default_config(m, n_out, k, fusion == 'swiglu')}, rel err {err:.1e}", flush=True)
            continue
        t_torch = per_launch_ms(cycle(partial(torch_op, xm, c, nw, fusion, res) for c in copies))
        ours = cycle(partial(dk.linear, xm, c, **kw) for c in copies)
        t_default = per_launch_ms(ours)
        best = (float("inf"), None)
        bm, *_, dot = default_config(m, n_out, k, fusion == "swiglu")
        for bn, bk, warps, stages, split in CONFIGS if dot else GEMV_CONFIGS:
            dkm._linear_config = lambda *_a, c=(bm, bn, bk, warps, stages, split, dot): c
            try:
                t = per_launch_ms(ours)
            except Exception as e:  # out of shared memory / registers for this config
                print(f"#   {name} m={m} {bn, bk, warps, stages, split}: {type(e).__name__}")
                continue
            finally:
                dkm._linear_config = default_config
            best = min(best, (t, (bm, bn, bk, warps, stages, split, dot)), key=lambda b: b[0])
        bound = (n * k * 2 + m * k * 2) / (tbps * 1e12) * 1e3  # weight and input read once
        row = dict(name=name, m=m, n=n, k=k, best_ms=best[0], best_config=best[1], default_ms=t_default,
                   torch_ms=t_torch, bound_ms=bound, rel_err=err)
        results["linear"].append(row)
        print(f"{name:18s} m={m:4d}: best {best[0] * 1e3:6.1f} us {best[1]}, default {t_default * 1e3:6.1f} us, "
              f"torch {t_torch * 1e3:6.1f} us, bound {bound * 1e3:5.1f} us, rel err {err:.1e}", flush=True)
    # attention, one new position per cache slot: rope_attend (norms, RoPE, cache write and attention in one
    # launch) per (BL, warps), against qk_norm_rope_store + SDPA over the slot's positions; the predictor's
    # 17-position cache, and the talker's at a few context lengths (why the talker attends with SDPA)
    attention_cases = [] if args.no_attention else itertools.product(
        [(17, 17, 1), (17, 17, 64), (1024, 200, 1), (1024, 200, 16), (1024, 200, 64), (1024, 1000, 1),
         (1024, 1000, 64)], (16, 32, 64, 128), (1, 2, 4, 8))
    default_attend = dka._attend_config
    for (length, ctx, m), bl, warps in attention_cases:
        args_ = attention_inputs(m, length, ctx)
        dka._attend_config = lambda *_a, c=(bl, warps): c
        try:
            t = per_launch_ms(partial(dk.rope_attend, *args_, HEADS, 1e-6))
            got = dk.rope_attend(*args_, HEADS, 1e-6)
        finally:
            dka._attend_config = default_attend

        def unfused(a=args_, m=m, ctx=ctx):
            q = dk.qk_norm_rope_store(*a, HEADS, KV_HEADS, 1e-6)
            o = F.scaled_dot_product_attention(q[:, :, None], a[4][:, :, :ctx], a[5][:, :, :ctx], enable_gqa=True)
            return o.reshape(m, -1)

        t_sdpa = per_launch_ms(unfused)
        ref = unfused().float()
        err = float((got.float() - ref).norm() / ref.norm())
        results["attention"].append(dict(cache=length, ctx=ctx, m=m, bl=bl, warps=warps, ms=t, sdpa_ms=t_sdpa,
                                         rel_err=err))
        print(f"rope_attend cache={length:5d} ctx={ctx:5d} m={m:4d} BL={bl:3d} warps={warps}: {t * 1e3:6.1f} us "
              f"(store + sdpa {t_sdpa * 1e3:6.1f} us), rel err {err:.1e}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


@triton.jit
def _pass_on(src, dst, N: tl.constexpr, READ: tl.constexpr):
    """READ: every program loads `src` [N]; program 0 stores it plus one to `dst` (the next launch's input)."""
    if READ:
        x = tl.load(src + tl.arange(0, N))
        if tl.program_id(0) == 0:
            tl.store(dst + tl.arange(0, N), x + 1)


def launch_floor(tbps: float) -> list[dict]:
    """Per-launch time in a graph of 20 back-to-back launches: empty kernels and one-read kernels at one
    program (one warp) and at a one-row GEMM's grid (1024 programs of four warps), then each one-row GEMM
    (served configuration, weights from memory) and its weight-read bound: what is left is fixed cost."""
    rows = []
    bufs = [torch.zeros(1024, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    turn = itertools.count()
    for read, (grid, warps) in itertools.product((False, True), ((1, 1), (1024, 4))):
        def launch(read=read, grid=grid, warps=warps):
            i = next(turn) % 2
            _pass_on[(grid,)](bufs[i], bufs[1 - i], N=1024, READ=read, num_warps=warps)

        t = per_launch_ms(launch)
        name = f"{'one 2 KB read' if read else 'empty'}, {grid} programs x {warps} warps"
        rows.append(dict(name=name, ms=t))
        print(f"# launch floor {name}: {t * 1e3:.2f} us", flush=True)
    for name, k, n, fusion in SHAPES:
        copies, x, _, _, kw = gemm_inputs(1, k, n, fusion)
        t = per_launch_ms(cycle(partial(dk.linear, x, c, **kw) for c in copies))
        bound = (n * k * 2 + k * 2) / (tbps * 1e12) * 1e3
        rows.append(dict(name=name, ms=t, bound_ms=bound))
        print(f"# one-row {name:18s}: {t * 1e3:5.2f} us, weight read {bound * 1e3:5.2f} us, "
              f"the rest {(t - bound) * 1e3:5.2f} us", flush=True)
        del copies
    return rows


def attention_inputs(m: int, length: int, ctx: int) -> tuple:
    """Random `rope_attend` arguments (bfloat16): m rows in slots 0..m-1 of a cache of `length` positions, each
    row's new position `ctx - 1`."""
    dev, hd = torch.device("cuda"), HEAD_DIM
    kc = torch.randn(m, KV_HEADS, length, hd, dtype=torch.bfloat16, device=dev)
    qkv = torch.randn(m, (HEADS + 2 * KV_HEADS) * hd, dtype=torch.bfloat16, device=dev)
    qn, kn = torch.rand(hd, device=dev).to(torch.bfloat16) + 0.5, torch.rand(hd, device=dev).to(torch.bfloat16)
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, hd, 2, device=dev).float() / hd)
    slot, pos = torch.arange(m, device=dev), torch.full((m,), ctx - 1, device=dev)
    return qkv, qn, kn, inv_freq, kc, torch.randn_like(kc), slot, pos


def split_attend_sweep(rows: list[int]) -> list[dict]:
    """`split_attend` per (positions per program, inner block) against the cache write + SDPA it replaced in
    the talker, one new position per row at `ctx - 1` in a step of attention width `width`."""
    out = []
    for (ctx, width), m in itertools.product([(151, 256), (601, 768)], rows):
        args_ = attention_inputs(m, 1024, ctx)
        pos = args_[-1]
        mask = (torch.arange(width, device=pos.device)[None, :] <= pos[:, None])[:, None, None, :]

        def unfused(a=args_, m=m, width=width, mask=mask):
            q = dk.qk_norm_rope_store(*a, HEADS, KV_HEADS, 1e-6)
            o = F.scaled_dot_product_attention(q[:, :, None], a[4][:, :, :width], a[5][:, :, :width],
                                               attn_mask=mask, enable_gqa=True)
            return o.reshape(m, -1)

        t_sdpa = per_launch_ms(unfused)
        ref = unfused().float()
        default = dka.SPLIT_POSITIONS, dka.SPLIT_BLOCK
        for per_program, block in itertools.product((16, 32, 64, 128), (16, 32, 64)):
            if block > per_program:
                continue
            dka.SPLIT_POSITIONS, dka.SPLIT_BLOCK = per_program, block
            try:
                fn = partial(dk.split_attend, *args_, HEADS, 1e-6, width)
                t = per_launch_ms(fn)
                err = float((fn().float() - ref).norm() / ref.norm())
            finally:
                dka.SPLIT_POSITIONS, dka.SPLIT_BLOCK = default
            out.append(dict(ctx=ctx, width=width, m=m, positions=per_program, block=block, ms=t, sdpa_ms=t_sdpa,
                            rel_err=err))
            print(f"split_attend ctx={ctx:4d} width={width:4d} m={m:3d} positions/program={per_program:3d} "
                  f"block={block:2d}: {t * 1e3:6.1f} us (store + sdpa {t_sdpa * 1e3:6.1f} us), rel err {err:.1e}",
                  flush=True)
    return out


if __name__ == "__main__":
    main()

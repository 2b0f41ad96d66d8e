"""Time the Triton decode kernels (streamvox/models/qwen3_tts/decode_kernels.py) at the 1.7B talker's and
code predictor's shapes, over a grid of launch configurations, against the torch ops they replace.

    python benchmarks/tune_decode_kernels.py [--rows 1 16 64 128] [--json-out F]

Each timing is the median of CUDA-graph replays of 20 back-to-back launches (launch cost as in the
frame step's graph), divided by 20. The launches cycle through copies of the weight, at least 256 MB of
them, so every launch reads its weight from memory, not the L2, as in the frame step (where a
predictor pass reads 160 MB of weights). Prints, per shape and row count, the best configuration, its
time, the time to read the weight once at the measured copy rate, and the torch time (cuBLAS GEMM plus
the unfused norm / SwiGLU / residual ops). GPU only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from functools import partial

import torch
import torch.nn.functional as F

from streamvox.models.qwen3_tts import decode_kernels as dk
from streamvox.models.qwen3_tts.cuda_graphs import capture_graph

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # both stacks' attention
# (name, K, N, fusion) at the 1.7B shapes: talker hidden 2048 / intermediate 6144, predictor 1024 / 3072
SHAPES = [
    ("pred.qkv", 1024, 4096, "norm"), ("pred.o", 2048, 1024, "residual"),
    ("pred.gate_up", 1024, 6144, "swiglu"), ("pred.down", 3072, 1024, "residual"), ("pred.head", 1024, 2048, "norm"),
    ("talker.qkv", 2048, 4096, "norm"), ("talker.o", 2048, 2048, "residual"),
    ("talker.gate_up", 2048, 12288, "swiglu"), ("talker.down", 6144, 2048, "residual"),
    ("talker.codec_head", 2048, 3072, ""),
]
# BN, BK, warps, stages, split (K split over that many programs per tile)
CONFIGS = [(bn, bk, 8 if bn == 64 else 4, stages, split)
           for bn, bk, stages, split in itertools.product((16, 32, 64), (128, 256), (3, 5), (1, 2, 4))]
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
    results = {"gpu": torch.cuda.get_device_name(), "copy_TBps": tbps, "linear": [], "attention": [], "repeat": []}
    default_config = dk._linear_config
    for (name, k, n, fusion), m in itertools.product(SHAPES, args.rows):
        copies = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) / k**0.5
                  for _ in range(-(-COLD_BYTES // (n * k * 2)))]
        w = copies[0]
        xm = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        nw = torch.rand(k, dtype=torch.bfloat16, device=dev) + 0.5
        n_out = n // 2 if fusion == "swiglu" else n
        res = torch.randn(m, n_out, dtype=torch.bfloat16, device=dev)
        kw = dict(norm=nw if fusion in ("norm", "swiglu") else None, eps=1e-6, swiglu=fusion == "swiglu",
                  residual=res if fusion == "residual" else None)
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
        bm = default_config(m, n_out, k, fusion == "swiglu")[0]
        for bn, bk, warps, stages, split in CONFIGS:
            dk._linear_config = lambda *_a, c=(bm, bn, bk, warps, stages, split): c
            try:
                t = per_launch_ms(ours)
            except Exception as e:  # out of shared memory / registers for this config
                print(f"#   {name} m={m} {bn, bk, warps, stages, split}: {type(e).__name__}")
                continue
            finally:
                dk._linear_config = default_config
            best = min(best, (t, (bm, bn, bk, warps, stages, split)), key=lambda b: b[0])
        bound = (n * k * 2 + m * k * 2) / (tbps * 1e12) * 1e3  # weight and input read once
        row = dict(name=name, m=m, n=n, k=k, best_ms=best[0], best_config=best[1], default_ms=t_default,
                   torch_ms=t_torch, bound_ms=bound, rel_err=err)
        results["linear"].append(row)
        print(f"{name:18s} m={m:4d}: best {best[0] * 1e3:6.1f} us {best[1]}, default {t_default * 1e3:6.1f} us, "
              f"torch {t_torch * 1e3:6.1f} us, bound {bound * 1e3:5.1f} us, rel err {err:.1e}", flush=True)
    # attention: predictor (17 positions, 16/8 heads) and talker contexts
    attention_cases = [] if args.no_attention else itertools.product(
        [(17, 1), (17, 128), (200, 1), (200, 64), (1000, 1), (1000, 64)], (16, 32, 64), (1, 2, 4))
    for (ctx, m), bl, warps in attention_cases:
        heads, kvh, hd = HEADS, KV_HEADS, HEAD_DIM
        kc = torch.randn(m, kvh, 1024, hd, dtype=torch.bfloat16, device=dev)
        vc = torch.randn_like(kc)
        q = torch.randn(m, heads, hd, dtype=torch.bfloat16, device=dev)
        slot = torch.arange(m, device=dev)
        pos = torch.full((m,), ctx - 1, device=dev)

        def run(bl=bl, warps=warps, q=q, kc=kc, vc=vc, slot=slot, pos=pos, m=m):
            out = torch.empty(m, HEADS * HEAD_DIM, dtype=q.dtype, device=dev)
            dk._decode_attention_kernel[(m, KV_HEADS)](
                q, kc, vc, slot, pos, out, kc.stride(0), kc.stride(1), kc.stride(2), HEAD_DIM**-0.5, NH=HEADS,
                REP=HEADS // KV_HEADS, HD=HEAD_DIM, BH=HEAD_DIM // 2, BL=bl, num_warps=warps)
            return out

        t = per_launch_ms(run)
        qs = q[:, :, None]
        sdpa = partial(F.scaled_dot_product_attention, qs, kc[:, :, :ctx], vc[:, :, :ctx], enable_gqa=True)
        t_sdpa = per_launch_ms(sdpa)
        ref = sdpa()
        err = float((run().float() - ref.reshape(m, -1).float()).norm() / ref.float().norm())
        results["attention"].append(dict(ctx=ctx, m=m, bl=bl, warps=warps, ms=t, sdpa_ms=t_sdpa, rel_err=err))
        print(f"attention ctx={ctx:5d} m={m:4d} BL={bl:3d} warps={warps}: {t * 1e3:6.1f} us "
              f"(sdpa {t_sdpa * 1e3:6.1f} us), rel err {err:.1e}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""A one-launch kernel against patched variants of it, timed interleaved in one process on one GPU.

The kernel is `talker_kernel.cu` or `predictor_kernel.cu`; a variant is a source spec of `kernel_sources.py`:
patches under `variants/` joined by + (applied with `git apply`), or a directory of patched sources. The same
kernel's time moves by 1-2% from one lent machine to the next, as much as most single changes gain, so a change
is judged here against the shipped kernel on the same GPU, in the same process, with the timings interleaved:
each round times every build once (its kernel alone in a CUDA graph, then the one-row frame step's graph), and
each build's figure is its median over the rounds.

Before timing, each variant runs eagerly on the same random inputs as the shipped kernel (the talker: its
cache restored before each call): the predictor's codes are counted identical or not and, where identical, the
embedding sum's relative difference is taken; the talker's output, key and value's. Summation-order changes
flip greedy codes of random weights on near-ties, so a few differing codes are expected; the relative
differences are not expected to exceed gpu_bench's comparisons with the per-layer kernels. A variant that fails
to build or to run is reported and left out.

    python benchmarks/make_real_shape_checkpoint.py --size 1.7b --out /tmp/q
    V=tools/kernel_lab/variants
    python tools/kernel_lab/kernel_ab.py --model /tmp/q --kernel predictor \\
        --patch $V/predictor-grid-128.patch --patch $V/predictor-split-rows.patch \\
        --patch $V/predictor-grid-128.patch+$V/predictor-split-rows.patch
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "benchmarks")]  # kernel_sources; gpu_bench (adds the repo)
import gpu_bench  # noqa: E402
import kernel_sources  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| in float32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


class Build:
    """One build of the kernel under test (the shipped source or a variant) in a frame stepper of its own."""

    def __init__(self, name: str, model, cache, which: str, files: dict[str, str]) -> None:
        self.name, self.which = name, which
        t0 = time.time()
        kernel_sources.install(which, kernel_sources.build(which, files, "ab"))
        self.stepper = gpu_bench.one_row_stepper(model, cache)
        self.kernel = getattr(self.stepper, gpu_bench.ONE_LAUNCH[which][1])
        assert self.kernel is not None
        gpu_bench.log(f"# {name}: built in {time.time() - t0:.1f} s")

    def run(self, state: int, cache, saved: tuple, pos: int) -> list[torch.Tensor]:
        """The kernel's outputs for random state `state` (the same for every build), run eagerly."""
        gen = torch.Generator(device="cuda").manual_seed(state)
        tc = self.stepper.model.cfg.talker
        bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
        with torch.inference_mode():
            if self.which == "predictor":
                for c in (self.stepper.pk, self.stepper.pv):  # positions 0 and 1 come from before the kernel
                    torch.nn.init.normal_(c, generator=gen)
                x, total = torch.randn(1024, **bf), torch.randn(tc.hidden_size, **bf)
                frames = torch.zeros(tc.num_code_groups, dtype=torch.long, device="cuda")
                self.kernel(x, frames, total)
                torch.cuda.synchronize()
                return [frames, total]
            cache.k.copy_(saved[0])
            cache.v.copy_(saved[1])
            out = self.kernel(torch.randn(tc.hidden_size, **bf), torch.tensor([pos], device="cuda"),
                              self.stepper.ar[:1])
            torch.cuda.synchronize()
            return [out.clone(), cache.k[:, 0, :, pos].clone(), cache.v[:, 0, :, pos].clone()]

    def time(self, graph, pos: int, iters: int) -> tuple[float, float]:
        """Microseconds of the kernel alone (graph replay) and milliseconds of the one-row frame step's graph."""
        alone = gpu_bench._time_cuda(graph.replay, iters=iters, warm=3) * 1e3
        st = self.stepper
        st.pos[0], st.count[0], st.token[0], st.active[0], st.text_ids[0] = pos, 5, 7, True, 1000
        step = gpu_bench._time_cuda(lambda: st.step(1, 256), iters=iters, warm=3)
        return alone, step


def compare(which: str, base: list[torch.Tensor], got: list[torch.Tensor]) -> tuple[bool, float]:
    """(codes identical (the predictor; the talker has none: True), worst relative difference of the rest)."""
    if which == "predictor":
        same = torch.equal(base[0], got[0])
        return same, rel(got[1], base[1]) if same else 0.0
    return True, max(rel(g, b) for g, b in zip(got, base, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--kernel", choices=sorted(gpu_bench.ONE_LAUNCH), required=True)
    ap.add_argument("--patch", action="append", default=[],
                    help="a variant: patches joined by + applied in order, or a directory of sources (repeat for more)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=30, help="replays a timing (median)")
    ap.add_argument("--states", type=int, default=8, help="random states compared with the shipped kernel")
    ap.add_argument("--pos", type=int, default=150, help="the talker position (its attention length)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel

    which = args.kernel
    res: dict = {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(), "kernel": which, "builds": {}}

    def save() -> None:  # as it goes, so a run cut short (a variant that hangs) keeps what it measured
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(res, f, indent=1)

    trees = []  # (name, patch, sources)
    for patch in [None, *args.patch]:
        name = "shipped" if patch is None else "+".join(Path(p).stem for p in patch.split("+"))
        try:
            trees.append((name, patch, kernel_sources.patched(patch)))
        except kernel_sources.PatchError as e:
            gpu_bench.log(f"# {name}: does not apply: {e}")
            res["builds"][name] = {"error": f"does not apply: {e}"}
    other = ({"talker", "predictor"} - {which}).pop()  # the frame steppers build it as shipped
    t0 = time.time()
    kernel_sources.build_all([(which, files, "ab") for _, _, files in trees] + [(other, None, "")])
    gpu_bench.log(f"# {len(trees) + 1} builds compiled side by side in {time.time() - t0:.1f} s")

    os.environ["STREAMVOX_QWEN3_" + gpu_bench.ONE_LAUNCH[which][0].upper()] = "1"  # the installed build or a failure
    model = Qwen3TTSModel.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16)
    cache = gpu_bench.talker_cache(model)
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.nn.init.normal_(cache.k, generator=gen)
    torch.nn.init.normal_(cache.v, generator=gen)
    saved = (cache.k.clone(), cache.v.clone())
    builds: list[Build] = []
    base_out: list[list[torch.Tensor]] = []

    for name, patch, files in trees:
        try:
            b = Build(name, model, cache, which, files)
            outs = [b.run(s, cache, saved, args.pos) for s in range(args.states)]
        except Exception as e:  # a broken variant is reported; the others still run
            if patch is None:
                raise
            gpu_bench.log(f"# {name}: failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
            res["builds"][name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        if patch is None:
            base_out = outs
        checks = [compare(which, a, g) for a, g in zip(base_out, outs, strict=True)]
        res["builds"][name] = {"identical_codes": sum(c[0] for c in checks), "states": args.states,
                               "worst_rel_diff": max(c[1] for c in checks), "alone_us": [], "step_ms": []}
        gpu_bench.log(f"# {name}: against shipped, {res['builds'][name]['identical_codes']}/{args.states} identical "
                      f"codes, worst relative difference {res['builds'][name]['worst_rel_diff']:.3g}")
        builds.append(b)
        save()

    graphs = [gpu_bench.kernel_alone_graph(b.stepper, which, args.pos) for b in builds]
    for _ in range(args.rounds):
        for b, (graph, _inputs) in zip(builds, graphs, strict=True):
            alone, step = b.time(graph, args.pos, args.iters)
            res["builds"][b.name]["alone_us"].append(alone)
            res["builds"][b.name]["step_ms"].append(step)
        save()

    base = res["builds"]["shipped"]
    gpu_bench.log(f"# {res['gpu']}; {which} kernel, grid {builds[0].kernel.grid}; medians of {args.rounds} "
                  f"interleaved rounds of {args.iters} replays")
    print("| build | kernel alone us (min-max) | vs shipped | one-row frame step ms | identical codes | "
          "worst rel. diff |\n|---|---|---|---|---|---|")
    for name, r in res["builds"].items():
        if "error" in r:
            print(f"| {name} | failed: {r['error'][:80]} | | | | |")
            continue
        r["alone_us_median"] = float(np.median(r["alone_us"]))
        r["step_ms_median"] = float(np.median(r["step_ms"]))
        shipped_us = float(np.median(base["alone_us"]))
        delta = r["alone_us_median"] - shipped_us
        print(f"| {name} | {r['alone_us_median']:.1f} ({min(r['alone_us']):.1f}-{max(r['alone_us']):.1f}) | "
              f"{delta:+.1f} ({100 * delta / shipped_us:+.1f}%) | {r['step_ms_median']:.3f} | "
              f"{r['identical_codes']}/{r['states']} | {r['worst_rel_diff']:.2g} |")
    save()


if __name__ == "__main__":
    main()

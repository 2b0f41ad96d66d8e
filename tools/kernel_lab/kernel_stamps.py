"""Where a one-launch kernel's time goes, phase by phase (`talker_kernel.cu` or `predictor_kernel.cu`, on the GPU).

A copy of the kernel's source is built in which thread 0 of every block adds up the clock cycles between fixed
points of the kernel's main loop, in source order: before each projection (`gemv(`: from the last barrier, the
phase's input load, attention and first wait for weights; after the predictor's head barrier, also the greedy
code and the next pass's input) and before and after each grid barrier (the projection, or the talker's
attention; then the wait at the barrier for the slowest block). Each point sums over the layers and passes.
The kernel alone is captured in a CUDA graph (as `gpu_bench.py --talker-kernel / --predictor-kernel` time it)
and replayed once after three warm-up replays; each point's cycles are averaged over the blocks and converted to
microseconds at the cycles a microsecond that replay ran at (the blocks' stamped cycles over its event time).

    python benchmarks/make_real_shape_checkpoint.py --size 1.7b --out /tmp/q
    python tools/kernel_lab/kernel_stamps.py --model /tmp/q --kernel talker
    python tools/kernel_lab/kernel_stamps.py --model /tmp/q --kernel predictor
    python tools/kernel_lab/kernel_stamps.py --model /tmp/q --kernel talker \\
        --patch tools/kernel_lab/variants/NAME.patch

Stamping itself costs a few percent of the launch (3-5% in sessions 19 and 23): read the split, not the total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "benchmarks")]  # kernel_sources; gpu_bench (adds the repo)
import gpu_bench  # noqa: E402
import kernel_sources  # noqa: E402

MAX_BLOCKS = 160
POINT = re.compile(r"^( *)(gemv\(|grid_sync<THREADS>\([^;]*;)", re.M)
INCLUDE = '#include "persistent.cuh"'
MODULE = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"
STAMP_CODE = """

__device__ unsigned long long stamp_sums[%(blocks)d][%(points)d];

// Thread 0: the cycles since the last stamp added to this block's sum for `point`.
__device__ __forceinline__ void stamp(int point, long long& last) {
  if (threadIdx.x == 0) {
    const long long now = clock64();
    stamp_sums[blockIdx.x][point] += now - last;
    last = now;
  }
}"""
READ_CODE = """std::vector<unsigned long long> read_stamps() {
  std::vector<unsigned long long> v(%(blocks)d * %(points)d);
  persistent::check(cudaMemcpyFromSymbol(v.data(), stamp_sums, v.size() * sizeof(v[0])), "stamps");
  return v;
}

void reset_stamps() {
  std::vector<unsigned long long> v(%(blocks)d * %(points)d);
  persistent::check(cudaMemcpyToSymbol(stamp_sums, v.data(), v.size() * sizeof(v[0])), "stamps");
}

"""
MODULE_DEFS = """
  m.def("stamps", &read_stamps);
  m.def("reset_stamps", &reset_stamps);"""


def kernel_span(text: str) -> tuple[int, int]:
    """The body of the source's `__global__` function: from after its opening brace to its closing one."""
    start = text.index("{", text.index("__global__")) + 1
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, i
    raise ValueError("unbalanced braces in the kernel")


def stamped_source(text: str) -> tuple[str, list[str]]:
    """`text` with a stamp at each point of its kernel (before each `gemv(`, around each `grid_sync`), the stamps
    readable through the module's `stamps()` and cleared by `reset_stamps()`; and a label for each point."""
    start, end = kernel_span(text)
    labels: list[str] = []

    def stamp(m: re.Match) -> str:
        indent, call = m.group(1), m.group(2)
        at = start + m.start()
        line = text.count("\n", 0, at) + 1
        if call.startswith("gemv("):
            code = text[at:text.index("\n", at)].strip()[:40]
            labels.append(f"line {line}: from the last point to `{code}`")
            return f"{indent}stamp({len(labels) - 1}, stamp_last); {call}"
        labels.extend([f"line {line}: from the last point to the barrier", f"line {line}: waiting at the barrier"])
        return f"{indent}stamp({len(labels) - 2}, stamp_last); {call} stamp({len(labels) - 1}, stamp_last);"

    body = POINT.sub(stamp, text[start:end])
    if not labels:
        raise ValueError("no stamp points found")
    sizes = {"blocks": MAX_BLOCKS, "points": len(labels)}
    head = text[:start].replace(INCLUDE, INCLUDE + STAMP_CODE % sizes, 1)
    tail = text[end:].replace(MODULE, READ_CODE % sizes + MODULE + MODULE_DEFS, 1)
    return head + "\n  long long stamp_last = clock64();" + body + tail, labels


def build_stamped(which: str, patch: str | None = None):
    """The stamped extension of `which`'s kernel (as shipped, or with a patch applied; built with the CUDA compiler)
    and its points' labels."""
    files = kernel_sources.patched(patch)
    name = f"{which}_kernel.cu"
    files[name], labels = stamped_source(files[name])
    return kernel_sources.build(which, files, "stamped"), labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--kernel", choices=sorted(gpu_bench.ONE_LAUNCH), required=True)
    ap.add_argument("--pos", type=int, default=150, help="the talker position (the talker's attention length)")
    ap.add_argument("--patch", default=None,
                    help="stamp a variant instead: variants/*.patch joined by +, or a directory of sources")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel

    ext, labels = build_stamped(args.kernel, args.patch)
    kernel_sources.install(args.kernel, ext)
    setting, attr = gpu_bench.ONE_LAUNCH[args.kernel]
    model = Qwen3TTSModel.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16)
    settings = gpu_bench._settings(**{setting: "1"})  # the stamped build or a failure
    stepper = gpu_bench.one_row_stepper(model, gpu_bench.talker_cache(model), settings)
    graph, _inputs = gpu_bench.kernel_alone_graph(stepper, args.kernel, args.pos)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    ext.reset_stamps()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    graph.replay()
    t1.record()
    torch.cuda.synchronize()
    us = t0.elapsed_time(t1) * 1e3
    grid = getattr(stepper, attr).grid
    assert grid <= MAX_BLOCKS, grid
    sums = np.array(ext.stamps(), dtype=np.float64).reshape(MAX_BLOCKS, len(labels))[:grid]
    sums = sums[sums.sum(axis=1) > 0]  # a variant may launch fewer blocks than the stepper's grid
    per_us = sums.sum(axis=1).mean() / us
    mean, worst = sums.mean(axis=0) / per_us, sums.max(axis=0) / per_us
    plain = gpu_bench._time_cuda(graph.replay, iters=20, warm=3) * 1e3
    gpu_bench.log(f"# {torch.cuda.get_device_name()}; {args.kernel} kernel, {len(sums)} blocks, one stamped replay "
                  f"{us:.1f} us ({plain:.1f} us a replay over 20); {per_us:.0f} cycles/us")
    print("| point | mean us (all layers/passes) | slowest block us |\n|---|---|---|")
    for label, m, w in zip(labels, mean, worst, strict=True):
        print(f"| {label} | {m:.1f} | {w:.1f} |")
    # Is a barrier's slowest block the same block every time (a spread of busy time between blocks as large as
    # the waits) or a different one each phase (busy times alike, the waits from phase-to-phase jitter)?
    waits = np.array([label.endswith("waiting at the barrier") for label in labels])
    busy, wait = sums[:, ~waits].sum(axis=1) / per_us, sums[:, waits].sum(axis=1) / per_us
    gpu_bench.log(f"# per block, us: busy (all but the barrier waits) min {busy.min():.1f} median "
                  f"{np.median(busy):.1f} max {busy.max():.1f}; waiting min {wait.min():.1f} median "
                  f"{np.median(wait):.1f} max {wait.max():.1f}; busiest blocks {np.argsort(-busy)[:8].tolist()}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "kernel": args.kernel, "blocks": len(sums), "replay_us": us,
                       "cycles_per_us": per_us, "points": labels, "mean_us": mean.tolist(),
                       "slowest_us": worst.tolist(), "busy_us": busy.tolist(), "wait_us": wait.tolist()}, f, indent=1)


if __name__ == "__main__":
    main()

"""Time the decode chains (streamvox/models/qwen3_tts/decode_chain.py) on a GPU against the per-layer
decode kernels they replace, over a few tile widths and warp counts, and check their codes.

    python benchmarks/tune_decode_chain.py --model DIR [--json-out F]

DIR: a checkpoint from make_real_shape_checkpoint.py (bfloat16 here). Per configuration: the one-row
frame-step graph (width 256, position 150) with one chain in place of its per-layer kernels, median of
30 replays, against the same graph without chains; and the codes of four frame steps, which should
equal the per-layer kernels' (bfloat16 rounding may differ where the chains sum in another order:
the talker's attention is the chain's own where the per-layer step uses SDPA; `gpu_bench.py --check`
compares in float32). Then both chains at their defaults together. GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from streamvox.models.qwen3_tts.cuda_graphs import FrameStepper
from streamvox.models.qwen3_tts.decode_chain import PredictorChain, TalkerChain
from streamvox.models.qwen3_tts.model import Qwen3TTSModel
from streamvox.models.qwen3_tts.runner import _SlotCache

# (chain, tile width multiplier over the per-layer kernels' one-row widths, num_warps, talker positions per
# split); the first of each chain is its default
CONFIGS = [("predictor", 1, 4, 0), ("predictor", 1, 8, 0), ("predictor", 2, 4, 0), ("predictor", 2, 8, 0),
           ("predictor", 4, 8, 0), ("talker", 1, 4, 64), ("talker", 1, 8, 64), ("talker", 2, 8, 64),
           ("talker", 1, 4, 32), ("talker", 1, 4, 128)]
WIDTH, POS, FRAMES = 256, 150, 4


def step_ms(st: FrameStepper) -> float:
    st.graphs.clear()
    st.pos[:1] = POS
    st.step(1, WIDTH)  # capture
    times = []
    for _ in range(30):
        st.pos[:1] = POS
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        st.step(1, WIDTH)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def codes(st: FrameStepper, h0: torch.Tensor, t0: torch.Tensor) -> torch.Tensor:
    st.active.zero_()
    st.active[:1] = True
    st.pos[:1] = POS
    st.hidden[:1] = h0
    st.token[:1] = t0
    st.count.zero_()
    st.seen.zero_()
    st.penalty.fill_(1.05)
    out = []
    for _ in range(FRAMES):
        st.step(1, WIDTH)
        out.append(st.frames[:1].clone())
    return torch.cat(out).cpu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    os.environ["STREAMVOX_QWEN3_WARMUP_WIDTHS"] = ""
    os.environ["STREAMVOX_QWEN3_CHAIN"] = "0"
    model = Qwen3TTSModel.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16)
    tc = model.cfg.talker
    cache = _SlotCache(tc.num_hidden_layers, 2, tc.num_key_value_heads, 1024, tc.head_dim, torch.bfloat16,
                       model.device)
    cache.k.normal_()
    cache.v.normal_()
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device="cuda")
    st = FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=True, use_kernels=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    h0 = torch.randn(1, tc.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    t0 = torch.randint(0, 2048, (1,), device="cuda", generator=g)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"# command: {' '.join(sys.argv)}")
    base_ms, base_codes = step_ms(st), codes(st, h0, t0)
    print(f"per-layer kernels: frame step {base_ms:.3f} ms", flush=True)
    results = {"gpu": torch.cuda.get_device_name(), "per_layer_ms": base_ms, "chains": []}
    cp = model.talker.code_predictor

    def run(label: str, **row) -> None:
        ms, got = step_ms(st), codes(st, h0, t0)
        same = int((got == base_codes).all(dim=1).sum())
        results["chains"].append(dict(row, step_ms=ms, identical_frames=same, frames=FRAMES))
        print(f"{label}: frame step {ms:.3f} ms (per-layer {base_ms:.3f}); codes identical in {same}/{FRAMES} "
              f"frames", flush=True)

    for chain, widen, warps, split in CONFIGS:
        st.pchain = st.tchain = None
        if chain == "predictor":
            st.pchain = PredictorChain(st.pstack, cp, st.pk, st.pv, widen=widen, num_warps=warps)
            programs = st.pchain.programs
        else:
            st.tchain = TalkerChain(st.tstack, cache.k, cache.v, positions_per_split=split, widen=widen,
                                    num_warps=warps)
            programs = sum(st.tchain.phase_programs(WIDTH))
        run(f"{chain} chain, widths x{widen}, {warps} warps, split {split} ({programs} programs)", chain=chain,
            widen=widen, num_warps=warps, positions_per_split=split, programs=programs)
    st.pchain = PredictorChain(st.pstack, cp, st.pk, st.pv)
    st.tchain = TalkerChain(st.tstack, cache.k, cache.v)
    run("both chains, defaults", chain="both")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Time the code predictor chain (streamvox/models/qwen3_tts/predictor_chain.py) on a GPU against the
per-layer decode kernels it replaces, over a few tile widths and warp counts, and check its codes.

    python benchmarks/tune_predictor_chain.py --model DIR [--json-out F]

DIR: a checkpoint from make_real_shape_checkpoint.py (bfloat16 here). For each configuration: the one-row
frame-step graph (width 256, position 150) with the chain, median of 30 replays, against the same graph
with the per-layer kernels; and the codes of four frame steps, which should equal the per-layer kernels'
(the chain's down projection sums its 3072 products in one block where `linear` takes two, so bfloat16
results may round differently; `gpu_bench.py --check` compares in float32). GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from streamvox.models.qwen3_tts.cuda_graphs import FrameStepper
from streamvox.models.qwen3_tts.model import Qwen3TTSModel
from streamvox.models.qwen3_tts.predictor_chain import PredictorChain
from streamvox.models.qwen3_tts.runner import _SlotCache

# (tile width multiplier over decode_kernels' one-row widths, num_warps); (1, 4) is the default
CONFIGS = [(1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (8, 8)]
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
    model = Qwen3TTSModel.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16)
    tc = model.cfg.talker
    cache = _SlotCache(tc.num_hidden_layers, 2, tc.num_key_value_heads, 1024, tc.head_dim, torch.bfloat16,
                       model.device)
    cache.k.normal_()
    cache.v.normal_()
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device="cuda")
    st = FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=True, use_kernels=True)
    st.chain = None
    g = torch.Generator(device="cuda").manual_seed(0)
    h0 = torch.randn(1, tc.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    t0 = torch.randint(0, 2048, (1,), device="cuda", generator=g)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"# command: {' '.join(sys.argv)}")
    base_ms, base_codes = step_ms(st), codes(st, h0, t0)
    print(f"per-layer kernels: frame step {base_ms:.3f} ms", flush=True)
    results = {"gpu": torch.cuda.get_device_name(), "per_layer_ms": base_ms, "chain": []}
    cp = model.talker.code_predictor
    for mult, warps in CONFIGS:
        widths = None
        if mult > 1:
            default = PredictorChain(st.pstack, cp, st.pk, st.pv).tiles
            widths = {k: v * mult for k, v in default.items() if k.startswith("BN_")}
        st.chain = PredictorChain(st.pstack, cp, st.pk, st.pv, widths=widths, num_warps=warps)
        ms, got = step_ms(st), codes(st, h0, t0)
        same = int((got == base_codes).all(dim=1).sum())
        row = dict(width_multiplier=mult, num_warps=warps, programs=st.chain.programs, step_ms=ms,
                   identical_frames=same, frames=FRAMES)
        results["chain"].append(row)
        print(f"chain widths x{mult} warps {warps} ({st.chain.programs} programs): frame step {ms:.3f} ms "
              f"(per-layer {base_ms:.3f}); codes identical in {same}/{FRAMES} frames", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

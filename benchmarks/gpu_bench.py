"""GPU benchmark for the two-stage Qwen3-TTS pipeline: correctness, step timings, serving, reference.

Parts (each a flag; all take --model DIR, a checkpoint from make_real_shape_checkpoint.py):
  --check      greedy codes of the same requests through: the CUDA graphs (also with the talker's cache
               write and SDPA in place of split_attend), the same stepper eagerly, the stepper with its torch
               layers instead of the Triton decode kernels, and the original eager runner path (float32 and
               bfloat16 reported); one frame step from the same state, graph against eager, bit for bit; the
               prefill graph against eager prefill (three prompts and one);
  --repeat     the greedy codes of 16 requests (each of --check-dtypes), graph and eager stepper twice each in
               one process, against the first graph run (do whole requests repeat, mode to mode and run to run?);
  --micro      per-step device time of the frame-step graph per batch bucket, with the Triton kernels (also
               with the talker's cache write and SDPA in place of split_attend) and with the torch layers
               (MICRO_EAGER=1 adds eager, MICRO_TORCH=0 leaves the torch layers out), prefill, the codec
               decoder per chunk
               (float32, TF32, bfloat16, float16, each one's error against strict float32;
               MICRO_DECODER=none skips it, =dtypes runs only it, =graphed times only the serving decoder,
               cuDNN autotuning off and on), measured copy bandwidth, and the memory-bandwidth bound of each;
  --serve      starts `streamvox serve` on the GPU and drives POST /v1/audio/speech (stream_format=audio,
               pcm), 10-second outputs (max_new_tokens 125, end-of-speech ignored via
               STREAMVOX_QWEN3_IGNORE_EOS=1 as the weights are random), greedy (temperature 0; --temperature T ...
               runs each level at each T, "default" sending none: the checkpoint's sampling);
               TTFP / E2E / RTF / playback stall p50 p95 p99 and audio seconds per second at each concurrency, with
               serving_bench's minimal HTTP client and with httpx (--clients); with --aligner, SSE with word
               timestamps off then on, --rounds times over at each level, and the tail: how long a request's end
               came after its last audio;
  --reference  the upstream `qwen-tts` package on the same GPU and weights (run with --ref-python and
               --ref-path, its own transformers), greedy, 125 frames: its RTF (TTFP = E2E: no streaming).

  python benchmarks/gpu_bench.py --model /tmp/q3-1.7b --check --micro --serve --reference \\
      --ref-path /tmp/refsite --json-out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from functools import partial

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

TEXT = ("The quick brown fox jumps over the lazy dog, then rests beneath a tall oak tree near the river.")
COPY_TBS = 4.3e12  # replaced by the measured copy bandwidth when --micro runs


def log(*a) -> None:
    print(*a, flush=True)


def _settings(**changes):
    """The Qwen3-TTS runtime settings from the environment (as the engine core reads them), with `changes`."""
    from dataclasses import replace

    from streamvox.settings import Qwen3Settings

    return replace(Qwen3Settings.from_env(), **changes)


# ------------------------------------------------------------------------------------------ check


class _Sink:
    def audio(self, *a):
        pass

    def finished(self, *a):
        pass

    def failed(self, rid, e):
        raise RuntimeError(e)


def _runner(model, mode: str, n_req: int, frames: int, on_frame=None):
    """A fresh runner in `mode` with n_req greedy requests added."""
    from streamvox.contract import SamplingParams, SpeechRequest
    from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
    from streamvox.settings import Qwen3Settings

    settings = _settings(fast="0" if mode == "runner-eager" else "1", cuda_graphs=mode.startswith("graph"),
                         kernels="0" if mode == "stepper-torch" else "auto",
                         # the served configuration, but for graph-sdpa
                         split_attend_max_rows=0 if mode == "graph-sdpa" else Qwen3Settings.split_attend_max_rows,
                         ignore_eos=True, warmup_widths="")
    runner = Qwen3TTSRunner(model, None, max_batch=64, max_seq_len=1024, on_frame=on_frame, settings=settings)
    if mode == "stepper-eager-bucketed":  # eager steps after the graphs' padded prefill shapes
        runner.stepper.bucketed_prefill = True
    words = TEXT.split()
    for i in range(n_req):
        text = " ".join(words[i % 5:] + words[: i % 5])
        runner.add(SpeechRequest(request_id=f"r{i}", text=text, voice=runner.info.voices[i % len(runner.info.voices)],
                                 language="english",
                                 sampling=SamplingParams(temperature=0.0, max_new_tokens=frames)))
    return runner


def _run_frames(model, mode: str, n_req: int, frames: int) -> dict:
    """Greedy frames of n_req concurrent requests through a fresh runner in `mode`."""
    out: dict[str, list] = {}
    runner = _runner(model, mode, n_req, frames, on_frame=lambda rid, f: out.setdefault(rid, []).append(f))
    sink = _Sink()
    while runner.has_work():
        runner.step(sink)
    return {k: torch.stack(v).cpu() for k, v in out.items()}


def _check_step_graph(model, n_req: int) -> dict:
    """One frame step from the same state (after six engine steps of n_req requests), replayed from its CUDA graph
    twice and run eagerly twice: whether the four agree bit for bit (frames, hidden states, keys). Unlike
    the greedy codes compared above, this does not depend on how sensitive random weights are to rounding."""
    runner, sink = _runner(model, "graph", n_req, 40), _Sink()
    for _ in range(6):
        runner.step(sink)
    torch.cuda.synchronize()
    st = runner.stepper
    (rows, width), graph = list(st.graphs.items())[-1]  # the bucket the steps used
    names = ("hidden", "token", "pos", "count", "seen", "text_ids", "pk", "pv")
    state = [getattr(st, n) for n in names] + [runner.cache.k, runner.cache.v]
    saved = [t.clone() for t in state]
    st.active[:n_req] = True
    outs = {}
    for name in ("graph", "eager", "graph again", "eager again"):
        for t, old in zip(state, saved, strict=True):
            t.copy_(old)
        with torch.inference_mode():
            if name.startswith("graph"):
                graph.replay()
            else:
                st._forward(rows, width)
        torch.cuda.synchronize()
        outs[name] = [st.frames[:rows].clone(), st.hidden[:rows].clone(), runner.cache.k[:, :rows].clone()]
    same = {name: all(torch.equal(a, b) for a, b in zip(outs["graph"], o, strict=True))
            for name, o in outs.items() if name != "graph"}
    row = {"rows": rows, "width": width, **{f"{k}_identical_to_graph": v for k, v in same.items()}}
    log(f"# check {model.dtype} one frame step from the same state, batch {n_req}: {json.dumps(row)}")
    return row


def check(model_dir: str, device: str, dtypes: tuple = (torch.float32, torch.bfloat16),
          requests: tuple = (1, 16)) -> dict:
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel

    res = {}
    # stepper-torch: the fast path's torch layers; stepper-eager and graph use the Triton decode kernels;
    # stepper-eager-bucketed: stepper-eager with the prefill padded to the graphs' buckets (the same prefill
    # shapes as graph, so only the frame steps' graph or not differs); graph-sdpa: the talker's attention as a
    # cache write and SDPA instead of split_attend
    modes = ["runner-eager", "stepper-torch", "stepper-eager", "stepper-eager-bucketed"] + (
        ["graph-sdpa", "graph"] if device == "cuda" else [])
    for dtype in dtypes:
        model = Qwen3TTSModel.from_pretrained(model_dir, device=device, dtype=dtype)
        name = str(dtype).split(".")[-1]
        for n_req in requests:
            got = {m: _run_frames(model, m, n_req, 40) for m in modes}
            row = {}
            base = got[modes[-1]]
            for m in modes[:-1]:
                same = sum(int((got[m][k] == base[k]).all(dim=1).sum()) for k in base)
                total = sum(base[k].shape[0] for k in base)
                first_diff = min((int((got[m][k] != base[k]).any(dim=1).nonzero()[0]) for k in base
                                  if (got[m][k] != base[k]).any()), default=None)
                row[f"{m}_vs_{modes[-1]}"] = {"identical_frames": same, "frames": total,
                                              "first_differing_frame": first_diff}
            res[f"{name}_batch{n_req}"] = row
            log(f"# check {dtype} batch {n_req}: {json.dumps(row)}")
        if device == "cuda":
            res[f"{name}_prefill"] = _check_prefill_graph(model, (60, 37, 51))
            res[f"{name}_prefill_one"] = _check_prefill_graph(model, (60,))
            for n_req in requests:
                res[f"{name}_step_batch{n_req}"] = _check_step_graph(model, n_req)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    if device == "cuda":
        res.update(_check_graphed_decoder(model_dir))
    return res


def repeat(model_dir: str, device: str, dtypes: tuple = (torch.float32,)) -> dict:
    """The greedy codes of the same 16 requests, per dtype: the graph and the eager stepper twice each and the
    bucketed eager stepper once, in one process: identical frames of each run against the first graph run."""
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel

    res = {}
    for dtype in dtypes:
        model = Qwen3TTSModel.from_pretrained(model_dir, device=device, dtype=dtype)
        name = str(dtype).split(".")[-1]
        base = None
        for i, mode in enumerate(("graph", "stepper-eager", "graph", "stepper-eager", "stepper-eager-bucketed")):
            got = _run_frames(model, mode, 16, 40)
            base = base or got
            same = sum(int((got[k] == base[k]).all(dim=1).sum()) for k in base)
            res[f"{name}_run{i + 1}_{mode}"] = {"identical_frames": same,
                                                "frames": sum(v.shape[0] for v in base.values())}
            log(f"# repeat {name}: {mode} (run {i + 1}) against graph (run 1): {same} identical frames")
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------------------------------------ micro


def _time_cuda(fn, iters: int = 30, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def micro(model_dir: str) -> dict:
    global COPY_TBS
    from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
    from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper

    out: dict = {}
    if os.environ.get("MICRO_DECODER", "all") == "graphed":  # only the serving decoder: cuDNN autotuning off, on
        st_dir = os.path.join(model_dir, "speech_tokenizer")
        codec = Code2Wav.from_pretrained(st_dir, device="cuda", dtype=torch.float32,
                                         compile_snake=_settings().codec_compile)
        codec.check_codes = False
        codes = torch.randint(0, 2048, (64, 16, 52), generator=torch.Generator().manual_seed(0)).cuda()
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            out.update(_micro_graphed_decoder(codec, codes, "_cudnn_benchmark" if bench else ""))
        torch.backends.cudnn.benchmark = False
        return out
    if os.environ.get("MICRO_DECODER", "all") == "dtypes":  # only the decoder per dtype
        return _micro_decoder_dtypes(model_dir, "dtypes")
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _time_cuda(lambda x=x, y=y: y.copy_(x), iters=10)
    COPY_TBS = 2 * x.numel() / (ms / 1e3)
    out["copy_TBps"] = COPY_TBS / 1e12
    del x, y
    log(f"# measured device copy bandwidth: {COPY_TBS / 1e12:.2f} TB/s (read + write)")

    model = Qwen3TTSModel.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16)
    tc = model.cfg.talker
    t = model.talker
    el = 2
    talker_b = sum(p.numel() for n, p in t.model.layers.named_parameters()) * el
    head_b = t.codec_head.weight.numel() * el
    cp = t.code_predictor
    cp_layers_b = sum(p.numel() for p in cp.model.layers.parameters()) * el
    cp_head_b = cp.lm_head[0].weight.numel() * el
    text_proj_b = sum(p.numel() for p in t.text_projection.parameters()) * el
    proj_b = sum(p.numel() for p in cp.small_to_mtp_projection.parameters()) * el
    # Per frame step: talker layers + codec head + text projection once; predictor layers and one head
    # per codebook step (15), the projection each step.
    step_weight_b = talker_b + head_b + text_proj_b + 15 * (cp_layers_b + cp_head_b + proj_b)
    out["weights_bytes_per_step"] = step_weight_b
    cache = talker_cache(model, slots=129)  # 128 slots + the stepper's scratch slot
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device="cuda")
    # (CUDA graphs, Triton decode kernels, the talker's attention by split_attend, the rows they run at)
    variants = [(True, True, True, (1, 4, 16, 64, 128)), (True, True, False, (1, 4, 16, 64, 128))]
    if os.environ.get("MICRO_TORCH", "1") == "1":
        variants.append((True, False, False, (1, 4, 16, 64)))
    if os.environ.get("MICRO_EAGER", "0") == "1":
        variants.append((False, True, True, (1, 4, 16, 64)))
    for graphs, kernels, split, sizes in variants:
        st = FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=graphs, use_kernels=kernels,
                          settings=_settings(split_attend_max_rows=256 if split else 0))
        name = ("graph" if graphs else "eager") + ("" if kernels else "_torch") + (
            "_sdpa" if kernels and not split else "")
        for b in sizes:
            st.active[:b] = True
            st.pos[:b] = 150
            st.pos[b:] = 0
            width = 256
            kv_b = 2 * tc.num_hidden_layers * b * tc.num_key_value_heads * width * tc.head_dim * el
            bound_ms = (step_weight_b + kv_b) / COPY_TBS * 1e3
            if graphs:
                st.step(b, width)  # capture
            ms = _time_cuda(lambda st=st, b=b, width=width: st.step(b, width), iters=30 if graphs else 5, warm=2)
            out[f"step_{name}_b{b}_ms"] = ms
            out[f"step_bound_b{b}_ms"] = bound_ms
            log(f"# frame step {name} B={b} width={width}: {ms:.3f} ms "
                f"(memory bound {bound_ms:.3f} ms; {b / ms * 1e3:.0f} frames/s)")
            st.pos.zero_()
        if graphs and kernels and split:
            # batched prefill (the fast path's, a CUDA graph per bucket): b prompts of 60 positions in one
            # forward, vs one at a time (eager)
            for b in (1, 4, 16, 64):
                embs = [torch.randn(60, tc.hidden_size, dtype=torch.bfloat16, device="cuda") for _ in range(b)]
                slots = list(range(b))
                ms = _time_cuda(lambda st=st, slots=slots, embs=embs: st.prefill_batch(slots, embs), iters=5, warm=2)
                out[f"prefill_batch{b}_60_ms"] = ms
                log(f"# batched prefill {b} x 60 positions: {ms:.2f} ms")
            ms = _time_cuda(lambda st=st, e=embs[0]: st.prefill_done(0, 60, st.prefill(0, e)), iters=5, warm=2)
            out["prefill_single_60_ms"] = ms
            log(f"# single prefill 60 positions (fused stack): {ms:.2f} ms")
        del st
    # prefill of one prompt (~60 positions)
    from streamvox.models.qwen3_tts.runtime.kv_cache import PrefillView

    emb = torch.randn(1, 60, tc.hidden_size, dtype=torch.bfloat16, device="cuda")
    pos = torch.arange(60, device="cuda")[None]
    ms = _time_cuda(lambda m=model, c=cache: m.talker.model.run(emb, pos, PrefillView(c, 0)), iters=10)
    out["prefill_60_ms"] = ms
    log(f"# talker prefill 60 positions: {ms:.3f} ms (memory bound {(talker_b) / COPY_TBS * 1e3:.3f} ms)")
    del model, cache
    torch.cuda.empty_cache()

    if os.environ.get("MICRO_DECODER", "all") == "none":
        return out
    out.update(_micro_decoder_dtypes(model_dir, os.environ.get("MICRO_DECODER", "all")))
    return out


ONE_LAUNCH = {"predictor": ("predictor_kernel", "pred_kernel"),  # the kernel's setting, the stepper's attribute
              "talker": ("talker_kernel", "talk_kernel")}


def talker_cache(model, slots: int = 3, positions: int = 1024):
    """A bfloat16 talker key/value cache for `model` (what the runner allocates, smaller)."""
    from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache

    tc = model.cfg.talker
    return SlotCache(tc.num_hidden_layers, slots, tc.num_key_value_heads, positions, tc.head_dim, torch.bfloat16,
                      model.device)


def one_row_stepper(model, cache, settings=None):
    """A frame stepper of up to 2 rows with CUDA graphs and the decode kernels (the one-launch kernels as
    `settings` say; by default as the environment does)."""
    from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper

    tc = model.cfg.talker
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device=model.device)
    return FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=True, use_kernels=True,
                        settings=settings or _settings())


def kernel_alone_graph(stepper, which: str, pos: int) -> tuple:
    """A CUDA graph of `stepper`'s one-launch kernel `which` alone, at one row and talker position `pos`, and the
    inputs it reads (keep them while replaying)."""
    from streamvox.models.qwen3_tts.kernels.graphs import capture_graph

    kernel = getattr(stepper, ONE_LAUNCH[which][1])
    tc = stepper.model.cfg.talker
    if which == "predictor":
        inputs = (torch.randn(1024, device="cuda", dtype=torch.bfloat16),
                  torch.zeros(tc.num_code_groups, dtype=torch.long, device="cuda"),
                  torch.zeros(tc.hidden_size, dtype=torch.bfloat16, device="cuda"))
    else:
        inputs = (torch.randn(tc.hidden_size, device="cuda", dtype=torch.bfloat16),
                  torch.tensor([pos], device="cuda"), stepper.ar[:1])
    graph, _ = capture_graph(lambda: kernel(*inputs), None)
    return graph, inputs


def one_launch_kernel(model_dir: str, which: str = "predictor", states: int = 24) -> dict:
    """A one-launch kernel (`which`: the code predictor's passes, `predictor_kernel`, or the talker's layers,
    `talker_kernel`) against the per-layer Triton kernels at one row, bfloat16: the same frame step from the same
    random states through both (eager); the step's codes (frame and next codebook-0 id) identical, and where they
    are, the caches and hidden state it wrote; the kernel's graph replayed against its eager run; the one-row
    frame-step graph's time with and without it, and the kernel's alone."""
    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
    from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper

    field, attr = ONE_LAUNCH[which]
    model = Qwen3TTSModel.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16)
    tc = model.cfg.talker
    cache = talker_cache(model)
    steppers = {}
    for name, setting in (("kernel", "1"), ("layers", "0")):
        t0 = time.time()
        steppers[name] = one_row_stepper(model, cache, _settings(**{field: setting}))
        log(f"# stepper with {field}={setting}: built in {time.time() - t0:.1f}s")
    on, off = steppers["kernel"], steppers["layers"]
    assert getattr(on, attr) is not None and getattr(off, attr) is None
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.nn.init.normal_(cache.k, generator=gen)
    torch.nn.init.normal_(cache.v, generator=gen)
    saved = (cache.k.clone(), cache.v.clone())
    same, worst = 0, 0.0
    outs: dict[str, list] = {}
    pos = 150

    def reset(st: FrameStepper, hidden: torch.Tensor, tok: int, i: int) -> None:
        """Row 0 of `st` and the talker cache back to random state `i`."""
        cache.k.copy_(saved[0])
        cache.v.copy_(saved[1])
        st.hidden[0] = hidden
        st.token[0] = tok
        st.pos[0] = pos
        st.count[0] = 5
        st.seen[0].zero_()
        st.active[0] = True
        st.text_ids[0] = 1000 + i

    def result(st: FrameStepper) -> list:
        """The step's codes, then what it wrote: predictor caches, talker cache at `pos`, hidden state."""
        return [torch.cat([st.frames[0], st.token[:1]]), st.pk[:, 0].clone(), st.pv[:, 0].clone(),
                cache.k[:, 0, :, pos].clone(), cache.v[:, 0, :, pos].clone(), st.hidden[0].clone()]

    for i in range(states):
        hidden = torch.randn(tc.hidden_size, device="cuda", generator=gen, dtype=torch.bfloat16)
        tok = int(torch.randint(0, 2048, (1,), generator=gen, device="cuda"))
        for name, st in steppers.items():
            reset(st, hidden, tok, i)
            with torch.inference_mode():
                if name == "kernel" and i == 0:  # the graph once: it must repeat the eager run bit for bit
                    st.step(1, 256)
                    torch.cuda.synchronize()
                    graph_out = result(st)
                    reset(st, hidden, tok, i)
                st._forward(1, 256)
            torch.cuda.synchronize()
            outs[name] = result(st)
            if name == "kernel" and i == 0:
                graph_same = all(torch.equal(a, b) for a, b in zip(graph_out, outs[name], strict=True))
        a, b = outs["kernel"], outs["layers"]
        if torch.equal(a[0], b[0]):
            same += 1
            for x, y in zip(a[1:], b[1:], strict=True):
                worst = max(worst, float((x.float() - y.float()).norm() / y.float().norm()))
        else:
            log(f"# {which} kernel state {i}: codes differ: {a[0].tolist()} vs {b[0].tolist()}")
    kernel = getattr(on, attr)
    res = {"kernel": which, "states": states, "identical_frames": same, "worst_rel_err_when_identical": worst,
           "graph_identical_to_eager": graph_same, "shared_bytes": kernel.shared_bytes, "grid": kernel.grid}
    log(f"# {which} kernel vs per-layer kernels, one row, bf16: {json.dumps(res)}")
    for name, st in steppers.items():
        st.pos[0] = pos
        st.step(1, 256)
        res[f"step_graph_b1_{name}_ms"] = _time_cuda(lambda st=st: st.step(1, 256), iters=50, warm=3)
        log(f"# frame step graph, one row, width 256, {which} {name}: {res[f'step_graph_b1_{name}_ms']:.3f} ms")
    graph, _inputs = kernel_alone_graph(on, which, pos)
    res["kernel_alone_ms"] = _time_cuda(graph.replay, iters=50, warm=3)
    log(f"# {which} kernel alone (graph): {res['kernel_alone_ms'] * 1e3:.1f} us")
    return res


def _micro_decoder_dtypes(model_dir: str, which: str) -> dict:
    """The streaming decoder (eager) per dtype: 25-frame chunks at 1, 16, 64 streams, first chunks, and each
    dtype's error against strict fp32 (`which`: "tf32" times only fp32 with TF32, plus the graphed decoder)."""
    from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav

    out: dict = {}
    st_dir = os.path.join(model_dir, "speech_tokenizer")
    wav = {}
    kinds = (("fp32-strict", torch.float32, False), ("fp32-tf32", torch.float32, True), ("bf16", torch.bfloat16, True),
             ("fp16", torch.float16, True))
    if which == "tf32":
        kinds = kinds[1:2]
    for name, dtype, tf32 in kinds:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        codec = Code2Wav.from_pretrained(st_dir, device="cuda", dtype=dtype, compile_snake=_settings().codec_compile)
        codec.check_codes = False
        g = torch.Generator().manual_seed(0)
        codes = torch.randint(0, 2048, (64, 16, 52), generator=g).cuda()
        # exactness sample: one stream, 2 + 25 + 25 frames
        s0 = codec.new_stream_state()
        pieces = [codec.decode_stream([codes[0, :, a:b]], [s0])[0] for a, b in ((0, 2), (2, 27), (27, 52))]
        wav[name] = torch.cat(pieces).float().cpu()
        for b in (1, 16, 64):
            states = [codec.new_stream_state() for _ in range(b)]
            codec.decode_stream([codes[i, :, :2] for i in range(b)], states)

            def call(states=states, b=b, codec=codec, codes=codes):
                # the same 25 frames again on a copy of the state each time (timing only)
                for s in states:
                    s.frames = 2
                return codec.decode_stream([codes[i, :, 2:27] for i in range(b)], states)

            ms = _time_cuda(call, iters=10, warm=2)
            out[f"decoder_{name}_b{b}_25frames_ms"] = ms
            log(f"# decoder {name} B={b} x 25 frames (2 s audio each): {ms:.2f} ms "
                f"({b * 2.0 / (ms / 1e3):.0f} audio s/s)")
        for b in (1, 64):  # small first chunks: one call's latency
            for f in (1, 2):
                def call(b=b, f=f, codec=codec, codes=codes):
                    states = [codec.new_stream_state() for _ in range(b)]
                    return codec.decode_stream([codes[i, :, :f] for i in range(b)], states)

                ms = _time_cuda(call, iters=10, warm=2)
                out[f"decoder_{name}_b{b}_{f}frames_first_ms"] = ms
                log(f"# decoder {name} B={b} first chunk of {f} frames: {ms:.2f} ms")
        if dtype == torch.float32 and tf32 and which != "dtypes":
            out.update(_micro_graphed_decoder(codec, codes))
        del codec
        torch.cuda.empty_cache()
    if which == "tf32":  # no strict-fp32 reference to compare with
        torch.backends.cudnn.allow_tf32 = True
        return out
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = wav["fp32-strict"]
    for name in ("fp32-tf32", "bf16", "fp16"):
        err = float((wav[name] - ref).norm() / ref.norm())
        out[f"decoder_{name}_rel_err_vs_fp32"] = err
        log(f"# decoder {name} vs strict fp32: relative L2 error {err:.2e} (SNR {-20 * np.log10(err + 1e-30):.1f} dB)")
    return out


def _micro_graphed_decoder(codec, codes: torch.Tensor, suffix: str = "") -> dict:
    """The serving decoder (`GraphedDecoder`, CUDA graphs, as the runner builds it for --max-batch 64):
    first chunks (lane 0) and 8- and 25-frame calls (lane 1). `suffix`: appended to the result keys."""
    from streamvox.models.qwen3_tts.codec.graphed import GraphedDecoder

    out = {}
    t0 = time.perf_counter()
    dec = GraphedDecoder(codec, slots=128, max_rows=64, lane_frames=(2, 25))
    dec.warmup()
    out[f"decoder_graphs_capture{suffix}_s"] = time.perf_counter() - t0
    log(f"# graphed decoder{suffix}: graphs captured in {time.perf_counter() - t0:.1f} s")
    for b in (1, 4, 16, 64):
        for f, lane in ((1, 0), (2, 0), (8, 1), (25, 1)):
            states = [dec.new_stream_state() for _ in range(b)]

            def call(b=b, f=f, lane=lane, states=states):
                for s in states:
                    s.frames = 0 if lane == 0 else 2
                return dec.decode_stream([codes[i, :, 2 : 2 + f] for i in range(b)], states, lane=lane)

            ms = _time_cuda(call, iters=10, warm=2)
            for s in states:
                dec.release_stream(s)
            out[f"decoder_graphed_b{b}_{f}frames{suffix}_ms"] = ms
            log(f"# graphed decoder{suffix} B={b} x {f} frames ({'first chunk' if lane == 0 else 'later chunk'}): "
                f"{ms:.2f} ms ({b * f * 0.08 / (ms / 1e3):.0f} audio s/s)")
    return out


def _check_prefill_graph(model, lens: tuple[int, ...]) -> dict:
    """The prefill graph (prompts of `lens` positions in their (rows, 64) bucket: (60, 37, 51) in (4, 64), one
    padded row on the scratch slot; (60,) in (1, 64)) against the same prompts prefilled eagerly, padded only
    to the longest: relative error of the last hidden states and of the written keys."""
    from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper
    from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache

    tc = model.cfg.talker
    g = torch.Generator(device="cuda").manual_seed(5)
    embeds = [0.05 * torch.randn(n, tc.hidden_size, generator=g, device="cuda", dtype=model.dtype) for n in lens]
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device="cuda")
    got = {}
    for graphs in (False, True):
        cache = SlotCache(tc.num_hidden_layers, 9, tc.num_key_value_heads, 256, tc.head_dim, model.dtype, model.device)
        st = FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=graphs, settings=_settings())
        slots = list(range(len(lens)))
        for s in slots:
            st.reset_slot(s, 1.0)
        st.prefill_batch(slots, embeds)
        keys = torch.cat([cache.k[:, s, :, :n].float().flatten() for s, n in enumerate(lens)])
        got[graphs] = (st.hidden[:len(lens)].float(), keys, st.token[:len(lens)].clone())
    (h0, k0, t0), (h1, k1, t1) = got[False], got[True]
    row = {"hidden_rel_err": float((h1 - h0).norm() / h0.norm()), "keys_rel_err": float((k1 - k0).norm() / k0.norm()),
           "same_first_ids": int((t0 == t1).sum()), "rows": len(lens)}
    log(f"# check {model.dtype} prefill graph vs eager, prompts of {lens} positions: {json.dumps(row)}")
    return row


def _check_graphed_decoder(model_dir: str) -> dict:
    """The graphed decoder against `Code2Wav.decode_stream` (both fp32/TF32), 8 streams of 2 + 25 + 7
    frames, several streams per call: relative L2 error of the audio."""
    from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
    from streamvox.models.qwen3_tts.codec.graphed import GraphedDecoder

    codec = Code2Wav.from_pretrained(os.path.join(model_dir, "speech_tokenizer"), device="cuda",
                                     compile_snake=_settings().codec_compile)
    codec.check_codes = False
    codes = torch.randint(0, 2048, (8, 16, 34), generator=torch.Generator().manual_seed(1)).cuda()
    dec = GraphedDecoder(codec, slots=16, max_rows=8, lane_frames=(2, 25))
    plain_states = [codec.new_stream_state() for _ in range(8)]
    graph_states = [dec.new_stream_state() for _ in range(8)]
    plain, graphed = [[] for _ in range(8)], [[] for _ in range(8)]
    for lane, (a, b) in ((0, (0, 2)), (1, (2, 27)), (1, (27, 34))):
        pieces = [codes[i, :, a:b] for i in range(8)]
        for i, w in enumerate(codec.decode_stream(pieces, plain_states)):
            plain[i].append(w.float().cpu())
        for i, w in enumerate(dec.decode_stream(pieces, graph_states, lane=lane)):
            graphed[i].append(w.float().cpu())
    ref = torch.cat([torch.cat(p) for p in plain])
    got = torch.cat([torch.cat(g) for g in graphed])
    err = float((got - ref).norm() / ref.norm())
    log(f"# graphed decoder vs Code2Wav.decode_stream: relative L2 error {err:.2e}")
    return {"graphed_decoder_rel_err": err}


def _kernel_sequence(prof, title: str) -> dict:
    """The device kernels of a profile in launch order: their summed time by name, and the sequence
    (name, us), so a pass of the code predictor can be read kernel by kernel."""
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    seq = [(e.name[:60], round(e.time_range.elapsed_us(), 2)) for e in evs]
    by_name: dict = {}
    for name, us in seq:
        n, t = by_name.get(name, (0, 0.0))
        by_name[name] = (n + 1, t + us)
    total = sum(us for _, us in seq)
    log(f"# {title}: {len(seq)} kernels, {total / 1e3:.3f} ms of kernel time")
    for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
        log(f"#   {t / 1e3:7.3f} ms  {n:4d} x {t / n:6.2f} us  {name}")
    log("#   sequence 40-100: " + " ".join(f"{name[:18]}:{us:.1f}" for name, us in seq[40:100]))
    return {"kernels": len(seq), "kernel_ms": total / 1e3, "by_name": by_name, "sequence": seq}


def profile(model_dir: str) -> dict:
    """Top CUDA kernels of one eager frame step (B=1, 16, 64 with the Triton kernels; B=64 with the torch
    layers) and one 60-position prefill."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
    from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper
    from streamvox.models.qwen3_tts.runtime.kv_cache import PrefillView

    model = Qwen3TTSModel.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16)
    tc = model.cfg.talker
    log(f"# talker dtype {model.dtype}, device {model.device}, weight contiguous "
        f"{model.talker.model.layers[0].mlp.up_proj.weight.is_contiguous()}")
    lin = model.talker.model.layers[0].mlp.up_proj
    xin = torch.randn(1, 1, tc.hidden_size, dtype=torch.bfloat16, device="cuda")
    ms = _time_cuda(lambda: lin(xin), iters=20)
    log(f"# one up_proj GEMV ({tuple(lin.weight.shape)}): {ms * 1000:.1f} us "
        f"(bound {lin.weight.numel() * 2 / COPY_TBS * 1e6:.1f} us)")
    cache = talker_cache(model, slots=65, positions=512)
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool, device="cuda")
    tables: dict = {}
    for kernels, sizes in ((True, (1, 16, 64)), (False, (64,))):
        st = FrameStepper(model, cache, suppress, tc.codec_eos_token_id, 2, use_graphs=False, use_kernels=kernels,
                          settings=_settings())
        layers = "Triton kernels" if kernels else "torch layers"
        for b in sizes:
            st.active[:b] = True
            for _ in range(3):
                st.step(b, 256)
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                st.step(b, 256)
                torch.cuda.synchronize()
            key = f"frame_step_b{b}" + ("" if kernels else "_torch")
            tables[key] = _kernel_sequence(prof, f"frame step B={b} (eager, {layers})")
    emb = torch.randn(1, 60, tc.hidden_size, dtype=torch.bfloat16, device="cuda")
    pos = torch.arange(60, device="cuda")[None]
    model.talker.model.run(emb, pos, PrefillView(cache, 0))
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.talker.model.run(emb, pos, PrefillView(cache, 0))
        torch.cuda.synchronize()
    tables["prefill_60"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=90)
    log(tables["prefill_60"])
    return tables  # kept in --json-out: a log filter cannot lose them


# ------------------------------------------------------------------------------------------ serve


async def _level(url: str, concurrency: int, n: int, frames: int, client: str, timestamps: bool | None = None,
                 temperature: float | None = 0.0) -> dict:
    """One concurrency level: a warm-up round (not counted), then `n` requests by `concurrency` workers, each
    sending `temperature` (None: no temperature, the checkpoint's default sampling).
    `client`: "raw" (serving_bench's minimal HTTP/1.1 client, one keep-alive connection per worker) or
    "httpx" (pure-Python HTTP in this one event loop: at 16 and 64 streams its own cost shows in TTFP and
    throughput, see RESULTS.md). `timestamps` True or False: SSE, with or without `word_timestamps` (raw client
    only); None: the pcm stream."""
    import httpx
    from serving_bench import RawConnection, one_request, one_request_raw

    body = {"input": TEXT, "response_format": "pcm", "stream_format": "audio", "sample_rate": 24000,
            "max_new_tokens": frames}
    if temperature is not None:
        body["temperature"] = temperature
    sse = timestamps is not None
    if sse:
        body.update(stream_format="sse", word_timestamps=timestamps)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        body["model"] = (await http.get("/v1/models")).json()["data"][0]["id"]

        async def run(count: int, workers: int) -> tuple[list, float]:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(count):
                queue.put_nowait(i)
            results: list = []

            async def worker() -> None:
                raw = RawConnection(url, {}) if client == "raw" else None
                send = partial(one_request_raw, raw) if raw is not None else partial(one_request, http)
                try:
                    while not queue.empty():
                        queue.get_nowait()
                        results.append(await send(body, sse, 24000))
                finally:
                    if raw is not None:
                        raw.close()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(workers)))
            return results, time.perf_counter() - t0

        await run(max(concurrency, 2), concurrency)  # warm-up, not counted
        results, wall = await run(n, concurrency)
    row: dict = {"concurrency": concurrency, "client": client, "requests": len(results), "sse": sse,
                 "word_timestamps": bool(timestamps), "temperature": temperature}
    if sse:
        row["timestamp_events_min"] = min(r["timestamp_events"] for r in results)
    for name, vals in (("ttfp_ms", [r["ttfp"] * 1000 for r in results]), ("e2e_ms", [r["e2e"] * 1000 for r in results]),
                       ("rtf", [r["rtf"] for r in results]), ("rtf_audio", [r["rtf_audio"] for r in results]),
                       ("stall_ms", [r["stall"] * 1000 for r in results]),
                       ("tail_ms", [r["tail"] * 1000 for r in results])):
        for q in (50, 95, 99):
            row[f"{name}_p{q}"] = float(np.percentile(vals, q))
    audio = sum(r["audio_s"] for r in results)
    row["audio_s_per_s"] = audio / wall
    row["mean_audio_s"] = audio / len(results)
    return row


def serve(model_dir: str, levels: list[int], frames: int, max_batch: int, clients: list[str],
          aligner: str | None = None, rounds: int = 1, temperatures: tuple[float | None, ...] = (0.0,)) -> list[dict]:
    """The levels with each client and each of `temperatures` (None: the checkpoint's default); with `aligner` (a
    server started with `--aligner`), SSE with word timestamps off, then on, at each level (raw client), `rounds`
    times over: the off rounds' spread is the run-to-run spread the on rounds are judged against."""
    from tests.helpers.server import Server, free_port

    env = {"STREAMVOX_QWEN3_IGNORE_EOS": "1", "STREAMVOX_QWEN3_WARMUP_WIDTHS": "256"}
    t0 = time.time()
    port = free_port()
    cmd = [sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port), "--log-level", "warning",
           "--model", model_dir, "--max-batch", str(max_batch)] + (["--aligner", aligner] if aligner else [])
    server = Server(subprocess.Popen(cmd, env={**os.environ, **env}), port, None)
    try:
        server.wait_healthy(timeout=400)  # model load + torch.compile + CUDA-graph capture
    except Exception:
        server.stop()
        raise
    log(f"# server up in {time.time() - t0:.1f}s")
    rows = []
    try:
        if aligner:
            runs = [(c, "raw", stamps) for c in levels for _ in range(rounds) for stamps in (False, True)]
        else:
            runs = [(c, client, None) for client in clients for c in levels]
        for temperature in temperatures:
            for c, client, timestamps in runs:
                row = asyncio.run(_level(server.url, c, max(16, 4 * c), frames, client, timestamps, temperature))
                rows.append(row)
                log(json.dumps(row))
    finally:
        server.stop()
    log("\n| temperature | client | word timestamps | concurrency | TTFP p50 ms | TTFP p95 | TTFP p99 | E2E p50 ms "
        "| E2E p95 | E2E p99 | RTF p50 | RTF p95 | RTF p99 | RTF to last audio p50 | audio s/s | stall p50 ms "
        "| stall p95 | tail p50 ms |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stamps = {None: "-", False: "off (SSE)", True: "on (SSE)"}[r["word_timestamps"] if r["sse"] else None]
        temp = "default" if r["temperature"] is None else r["temperature"]
        log(f"| {temp} | {r['client']} | {stamps} | {r['concurrency']} | {r['ttfp_ms_p50']:.1f} "
            f"| {r['ttfp_ms_p95']:.1f} | {r['ttfp_ms_p99']:.1f} "
            f"| {r['e2e_ms_p50']:.0f} | {r['e2e_ms_p95']:.0f} | {r['e2e_ms_p99']:.0f} | {r['rtf_p50']:.4f} "
            f"| {r['rtf_p95']:.4f} | {r['rtf_p99']:.4f} | {r['rtf_audio_p50']:.4f} "
            f"| {r['audio_s_per_s']:.1f} | {r['stall_ms_p50']:.0f} "
            f"| {r['stall_ms_p95']:.0f} | {r['tail_ms_p50']:.1f} |")
    return rows


# ------------------------------------------------------------------------------------------ reference


def reference_worker(model_dir: str, frames: int, runs: int) -> None:
    """Runs under the reference's own site-packages (transformers 4.57): prints one JSON line."""
    import importlib.machinery
    import types

    lib = types.ModuleType("librosa")  # only voice cloning's mel features use librosa
    lib.__spec__ = importlib.machinery.ModuleSpec("librosa", None)
    lib.filters = types.ModuleType("librosa.filters")
    lib.filters.__spec__ = importlib.machinery.ModuleSpec("librosa.filters", None)
    lib.filters.mel = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("librosa stub"))
    sys.modules["librosa"], sys.modules["librosa.filters"] = lib, lib.filters
    from qwen_tts import Qwen3TTSModel

    t0 = time.time()
    tts = Qwen3TTSModel.from_pretrained(model_dir, device_map="cuda:0", dtype=torch.bfloat16)
    load_s = time.time() - t0
    speaker = sorted(tts.model.config.talker_config.spk_id)[0]
    res = []
    for i in range(runs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        wavs, sr = tts.generate_custom_voice(text=TEXT, speaker=speaker, language="English", do_sample=False,
                                             subtalker_dosample=False, max_new_tokens=frames)
        torch.cuda.synchronize()
        e2e = time.perf_counter() - t0
        audio_s = len(wavs[0]) / sr
        if i:  # the first is warm-up
            res.append({"e2e_s": e2e, "audio_s": audio_s, "rtf": e2e / audio_s})
    print(json.dumps({"load_s": load_s, "runs": res}), flush=True)


def reference(model_dir: str, frames: int, runs: int, ref_python: str, ref_path: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ref_path + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [ref_python, os.path.abspath(__file__), "--model", model_dir, "--reference-worker",
           "--frames", str(frames), "--ref-runs", str(runs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not line:
        log("# reference failed:\n" + proc.stdout[-3000:] + proc.stderr[-5000:])
        return {"error": proc.stderr[-2000:]}
    out = json.loads(line[-1])
    rtf = [r["rtf"] for r in out["runs"]]
    e2e = [r["e2e_s"] for r in out["runs"]]
    out["rtf_median"] = float(np.median(rtf))
    out["e2e_median_ms"] = float(np.median(e2e)) * 1000
    log(f"# qwen-tts reference (bf16, greedy, {frames} frames max): E2E=TTFP median {out['e2e_median_ms']:.0f} ms, "
        f"audio {out['runs'][0]['audio_s']:.2f} s, RTF median {out['rtf_median']:.4f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--repeat", action="store_true")
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--predictor-kernel", action="store_true")
    ap.add_argument("--talker-kernel", action="store_true")
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check-dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--check-requests", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--clients", nargs="+", choices=["raw", "httpx"], default=["raw", "httpx"],
                    help="HTTP clients that drive --serve, each over every level (default both)")
    ap.add_argument("--frames", type=int, default=125)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--temperature", nargs="+", default=["0"],
                    help="--serve: each level at each temperature; 'default': none sent (the checkpoint's sampling)")
    ap.add_argument("--aligner", default=None, help="--serve: a forced-aligner checkpoint; SSE, timestamps off and on")
    ap.add_argument("--rounds", type=int, default=1, help="--serve --aligner: timestamps off then on, this many times")
    ap.add_argument("--ref-runs", type=int, default=3)
    ap.add_argument("--ref-python", default=sys.executable)
    ap.add_argument("--ref-path", default="")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if args.reference_worker:
        reference_worker(args.model, args.frames, args.ref_runs)
        return
    results: dict = {"command": " ".join(sys.argv), "model": args.model,
                     "env": {k: v for k, v in os.environ.items() if k.startswith("STREAMVOX_")}}
    if torch.cuda.is_available():
        results["gpu"] = torch.cuda.get_device_name()
        log(f"# GPU: {results['gpu']}; torch {torch.__version__}")

    def save() -> None:
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(results, f, indent=1)

    dtypes = tuple(getattr(torch, d) for d in args.check_dtypes)
    temperatures = tuple(None if t == "default" else float(t) for t in args.temperature)
    parts = [("profile", lambda: profile(args.model)),
             ("check", lambda: check(args.model, args.device, dtypes, tuple(args.check_requests))),
             ("repeat", lambda: repeat(args.model, args.device, dtypes)),
             ("micro", lambda: micro(args.model)),
             ("predictor_kernel", lambda: one_launch_kernel(args.model, "predictor")),
             ("talker_kernel", lambda: one_launch_kernel(args.model, "talker")),
             ("serve", lambda: serve(args.model, args.concurrency, args.frames, args.max_batch, args.clients,
                                     args.aligner, args.rounds, temperatures)),
             ("reference", lambda: reference(args.model, args.frames, args.ref_runs, args.ref_python, args.ref_path))]
    for name, fn in parts:
        if not getattr(args, name):
            continue
        t0 = time.time()
        try:
            results[name] = fn()
        except Exception as e:  # keep the other parts' results
            import traceback

            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        log(f"# part {name} took {time.time() - t0:.1f}s")
        save()


if __name__ == "__main__":
    main()

"""Where a batch of clauses spends its time in the Qwen3 forced aligner's `align_batch`, step by step.

Not shipped and not a benchmark (`benchmarks/alignment_bench.py --latency` gives the figure): this splits one
batch's wall time into its steps, each waited for on the device before the next starts:
prepare (checks, on the host), inputs (features on the device, prompts), forward (bucket copy-in, graph replay
or eager forward, classes back to the host) and post (times repaired, word spans).

  python tools/aligner/phases.py --aligner /tmp/fa --device cuda [--fused 0] [--graphs 0] [--streams 16] [--join 3]
                                [--split]

`--split` (CUDA) then times the last batch's padded forward in two parts, each replayed from a graph of its own:
the audio tower, and the text body with the head.

`--join 3` aligns three clauses as one item (about 9 s), the shape of a whole reply's final job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.alignment_bench import CORPUS, clauses  # noqa: E402
from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner  # noqa: E402
from streamvox.models.alignment.qwen3_aligner.words import repaired, word_spans  # noqa: E402
from streamvox.models.espeak.library import EspeakLibrary  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aligner", required=True, help="a Qwen3-ForcedAligner checkpoint directory")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--graphs", default="auto", choices=("auto", "0", "1"))
    ap.add_argument("--fused", default="auto", choices=("auto", "0", "1"))
    ap.add_argument("--streams", type=int, default=16, help="clauses a batch")
    ap.add_argument("--batches", type=int, default=30, help="timed batches, after as many untimed ones")
    ap.add_argument("--join", type=int, default=1, help="consecutive clauses an item says")
    ap.add_argument("--split", action="store_true", help="time the audio tower and the text body apart (CUDA)")
    args = ap.parse_args()

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    espeak = EspeakLibrary()
    espeak.set_voice("en-us")
    pool = clauses([line.strip() for line in open(CORPUS, encoding="utf-8") if line.strip()], espeak)
    if args.join > 1:
        pool = [(np.concatenate([pcm for pcm, _, _ in run]), run[0][1], [w for _, _, words in run for w in words])
                for run in (pool[i : i + args.join] for i in range(0, len(pool) - args.join + 1, args.join))]
    started = time.perf_counter()
    aligner = Qwen3ForcedAligner.from_pretrained(args.aligner, args.device,
                                                 torch.bfloat16 if cuda else torch.float32, args.graphs, args.fused)
    print(f"loaded (warmed up, on CUDA) in {time.perf_counter() - started:.1f} s")
    n = args.streams
    batches = [[pool[(b * n + i) % len(pool)] for i in range(n)] for b in range(2 * args.batches)]
    steps: dict[str, list[float]] = {"prepare": [], "inputs": [], "forward": [], "post": []}
    for b, batch in enumerate(batches):
        sync()
        t0 = time.perf_counter()
        _, prepared = aligner._prepare(batch)
        t1 = time.perf_counter()
        with aligner._on_device():
            ids, markers, features, frames = aligner._inputs(prepared)
            sync()
            t2 = time.perf_counter()
            every = aligner.graphed.classes(ids, features, frames) if aligner.graphed is not None else None
            if every is None:  # eager
                logits = aligner.module.thinker(ids.to(aligner.device), features, frames, markers.to(aligner.device))
                classes = logits.argmax(dim=-1).cpu().split(markers.sum(dim=1).tolist())
            else:
                classes = every[markers].split(markers.sum(dim=1).tolist())
            sync()
            t3 = time.perf_counter()
        for item, part in zip(prepared, classes, strict=True):
            word_spans(item.words, repaired([c * aligner.cfg.timestamp_segment_ms for c in part.tolist()]))
        t4 = time.perf_counter()
        if b >= args.batches:
            for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name].append(1000 * seconds)
    seconds = statistics.mean(len(pcm) / rate for pcm, rate, _ in pool)
    print(f"{n} items of {args.join} clause(s) ({seconds:.1f} s on average) a batch, p50 ms: "
          + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in steps.items()))
    if args.split and cuda:
        split(aligner, batches[-1], args.batches)


def split(aligner: Qwen3ForcedAligner, batch: list, repeats: int) -> None:
    """The padded forward of `batch` as two graphs, the audio tower's and the text body's: p50 ms of each."""
    thinker = aligner.module.thinker
    tower, body = thinker.audio_tower, thinker.model
    _, prepared = aligner._prepare(batch)
    with aligner._on_device():
        ids, _, features, frames = aligner._inputs(prepared)
        chunk = tower.chunk
        padded = torch.zeros(features.shape[0], features.shape[1], -(-features.shape[2] // chunk) * chunk,
                             device=features.device, dtype=aligner.dtype)
        padded[..., : features.shape[2]] = features
        ids = ids.to(aligner.device)
        valid = torch.tensor(frames, device=aligner.device)
        index = (torch.arange(ids.shape[1], device=ids.device) - 1).clamp(0, None)

        def encode() -> torch.Tensor:
            return tower.forward_padded(padded, valid)[0]

        audio = encode()
        index = index.clamp(max=audio.shape[1] - 1)

        def text() -> torch.Tensor:
            x = body.embed_tokens(ids)
            x = torch.where((ids == aligner.cfg.audio_token_id)[..., None], audio[:, index].to(x.dtype), x)
            return thinker.lm_head(body(x)).argmax(dim=-1)

        text()
        times = {}
        for name, fn in (("audio tower", encode), ("text body + head", text)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
                fn()
            runs = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                graph.replay()
                torch.cuda.synchronize()
                runs.append(1000 * (time.perf_counter() - t0))
            times[name] = statistics.median(runs)
    print(f"split of the forward ({len(prepared)} items, {padded.shape[2] // chunk} chunks, {ids.shape[1]} "
          "prompt positions), p50 ms: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))


if __name__ == "__main__":
    main()

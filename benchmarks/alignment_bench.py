"""Word-alignment accuracy and cost: an aligner's word starts against eSpeak NG's own word events.

eSpeak reports the exact sample where it starts each word (`streamvox.models.espeak.word_timing`),
so its audio comes with ground truth. For every sentence of a fixed English corpus (numbers and
abbreviations included), the sentence is synthesised once, and the aligner aligns that audio with
the sentence's text. Only words with an eSpeak event of their own are scored.

Reports the mean, p50, p90 and p95 absolute error of word starts (targets: mean <= 20 ms,
p95 <= 50 ms), how many sentences failed to align, and the aligner's CPU (and wall) time per second
of audio. `--aligner` is "pocketsphinx" or a Qwen3-ForcedAligner-0.6B directory (`--device`, `--dtype`).

`--latency` times instead what serving pays per clause on the device: batches of N clauses
(`--streams`, one clause per stream) of typical length (2-4 s of audio, 6-12 words), each one
`align_batch` (resampling and features on the device, prompts, one forward, the timings read back), after
warm-up; p50 and p95 ms per batch (target: p50 <= 15 ms at 16 streams).

`--streaming` measures the serving runner's incremental path (`AligningRunner`): requests of
`--join` consecutive corpus sentences, each request's audio fed in `--chunk` s chunks (its text
whole at the start, as a request's input is), the aligner keeping up. It reports the start error of
the words committed while the request spoke and of those only aligned at its end, and how early
words were committed: the mean lead (the request's audio end minus the audio sent when the word's
timing was sent) and the share committed before the end. Examples:

  python benchmarks/alignment_bench.py --aligner pocketsphinx
  python benchmarks/alignment_bench.py --aligner pocketsphinx --streaming
  python benchmarks/make_real_shape_checkpoint.py --aligner --out /tmp/fa-0.6b
  python benchmarks/alignment_bench.py --aligner /tmp/fa-0.6b --device cuda --latency --streams 1 16
  python benchmarks/alignment_bench.py --aligner /tmp/fa-0.6b --device cuda --latency --graphs 0 --fused 0  # eager
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from streamvox.models.alignment.word_aligner import AlignmentFailed, WordAligner  # noqa: E402
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "corpus", "english_sentences.txt")
TARGET_MEAN_MS, TARGET_P95_MS = 20.0, 50.0
TARGET_LATENCY_P50_MS = 15.0  # per batch, at 16 streams
CLAUSE_S, CLAUSE_WORDS = (2.0, 4.0), (6, 12)


def reference_starts(text: str, events, sample_rate: int) -> list[float | None]:
    """Each word's start per eSpeak (its first word event), None for a word with no event of its own."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    starts: list[float | None] = [None] * len(ends)
    for event in events:
        if event.kind != EVENT_WORD:
            continue
        i = next((k for k, end in enumerate(ends) if end > event.text_position - 1), None)
        if i is not None and starts[i] is None:
            starts[i] = event.sample / sample_rate
    return starts


def load_aligner(name: str, espeak: EspeakLibrary, device: str, dtype: str, graphs: str, fused: str) -> WordAligner:
    if name == "pocketsphinx":
        from streamvox.models.alignment.pocketsphinx_aligner import PocketsphinxAligner

        return PocketsphinxAligner(espeak.phonemes)
    import torch

    from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return Qwen3ForcedAligner.from_pretrained(name, device, getattr(torch, dtype), graphs, fused)


def synthesise(espeak: EspeakLibrary, text: str) -> tuple[np.ndarray, list]:
    events, parts = [], []
    espeak.synthesize(text, lambda pcm, parts=parts: parts.append(pcm) or True, events)
    return np.concatenate(parts).astype(np.float32) / 32768.0, events


def accuracy(args, sentences: list[str], espeak: EspeakLibrary, aligner: WordAligner) -> dict:
    rate = espeak.sample_rate
    errors_ms: list[float] = []
    failed: list[str] = []
    cpu_s = wall_s = audio_s = 0.0
    for text in sentences:
        pcm, events = synthesise(espeak, text)
        words = text.split()
        reference = reference_starts(text, events, rate)
        audio_s += len(pcm) / rate
        started, started_wall = time.process_time(), time.perf_counter()
        try:
            spans = aligner.align(pcm, rate, words)
        except AlignmentFailed:
            failed.append(text)
            continue
        finally:
            cpu_s += time.process_time() - started
            wall_s += time.perf_counter() - started_wall
        errors_ms += [abs(start - truth) * 1000 for (start, _), truth in zip(spans, reference, strict=True)
                      if truth is not None]
    for text in failed:
        print("failed to align:", text, file=sys.stderr)
    errors = np.array(errors_ms)
    figures = {
        "sentences": len(sentences),
        "failed_sentences": len(failed),
        "words_scored": len(errors),
        "mean_abs_error_ms": round(float(errors.mean()), 1),
        "p50_ms": round(float(np.percentile(errors, 50)), 1),
        "p90_ms": round(float(np.percentile(errors, 90)), 1),
        "p95_ms": round(float(np.percentile(errors, 95)), 1),
        "max_ms": round(float(errors.max()), 1),
        "audio_s": round(audio_s, 1),
        "cpu_s_per_audio_s": round(cpu_s / audio_s, 4),
        "wall_s_per_audio_s": round(wall_s / audio_s, 4),
        "targets": {"mean_abs_error_ms": TARGET_MEAN_MS, "p95_ms": TARGET_P95_MS},
    }
    met = figures["mean_abs_error_ms"] <= TARGET_MEAN_MS and figures["p95_ms"] <= TARGET_P95_MS
    print("targets met" if met else "targets NOT met", file=sys.stderr)
    return figures


def clauses(sentences: list[str], espeak: EspeakLibrary) -> list[tuple[np.ndarray, int, list[str]]]:
    """The corpus sentences of typical clause length (`CLAUSE_S` seconds, `CLAUSE_WORDS` words), spoken."""
    out = []
    for text in sentences:
        words = text.split()
        if not CLAUSE_WORDS[0] <= len(words) <= CLAUSE_WORDS[1]:
            continue
        pcm, _ = synthesise(espeak, text)
        if CLAUSE_S[0] <= len(pcm) / espeak.sample_rate <= CLAUSE_S[1]:
            out.append((pcm, espeak.sample_rate, words))
    if not out:
        raise SystemExit("no corpus sentence has a clause's length")
    return out


def latency(args, sentences: list[str], espeak: EspeakLibrary, aligner: WordAligner) -> dict:
    import torch

    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    pool = clauses(sentences, espeak)
    figures: dict = {"clauses": len(pool), "mean_clause_s": round(float(np.mean([len(p) / r for p, r, _ in pool])), 2),
                     "mean_clause_words": round(float(np.mean([len(w) for _, _, w in pool])), 1), "streams": {}}
    for streams in args.streams:
        batches = [[pool[(b * streams + i) % len(pool)] for i in range(streams)]
                   for b in range(args.warmup + args.iterations)]
        times_ms, failed = [], 0
        for b, batch in enumerate(batches):
            synchronize()
            started = time.perf_counter()
            results = aligner.align_batch(batch)
            synchronize()
            if b >= args.warmup:
                times_ms.append((time.perf_counter() - started) * 1000)
                failed += sum(isinstance(r, AlignmentFailed) for r in results)
        p50 = float(np.percentile(times_ms, 50))
        figures["streams"][str(streams)] = {
            "batches": len(times_ms), "failed_clauses": failed,
            "p50_ms_per_batch": round(p50, 2), "p95_ms_per_batch": round(float(np.percentile(times_ms, 95)), 2),
            "p50_ms_per_clause": round(p50 / streams, 2),
        }
    if "16" in figures["streams"]:
        met = figures["streams"]["16"]["p50_ms_per_batch"] <= TARGET_LATENCY_P50_MS
        print("latency target met" if met else "latency target NOT met", file=sys.stderr)
    figures["target_p50_ms_per_batch_at_16"] = TARGET_LATENCY_P50_MS
    return figures


def _error_figures(errors_ms: list[float]) -> dict:
    errors = np.array(errors_ms) if errors_ms else np.zeros(1)
    return {"words_scored": len(errors_ms), "mean_abs_error_ms": round(float(errors.mean()), 1),
            "p95_ms": round(float(np.percentile(errors, 95)), 1), "max_ms": round(float(errors.max()), 1)}


def streaming(args, sentences: list[str], espeak: EspeakLibrary, aligner: WordAligner) -> dict:
    from streamvox.contract import ModelInfo, SpeechRequest
    from streamvox.models.alignment.runner import AligningRunner

    rate = espeak.sample_rate
    chunk = int(args.chunk * rate)

    class Speaker:  # one request at a time: its audio, a chunk a step
        info = ModelInfo(name="bench", family="bench", sample_rate=rate, voices=["v"], default_voice="v")
        chunks: list[np.ndarray] = []

        def add(self, request):
            pass

        def feed_text(self, request_id, text):
            pass

        def end_input(self, request_id):
            pass

        def release(self, request_id):
            self.chunks = []

        def has_work(self):
            return self.chunks is not None

        def step(self, sink):
            if self.chunks:
                sink.audio("r", self.chunks.pop(0))
            else:
                self.chunks = None
                sink.finished("r", "stop", 0, 0)

    class Sink:
        def __init__(self):
            self.sent = 0
            self.timed: list[tuple[float, float]] = []  # (start, audio sent when it was sent)
            self.done = False

        def audio(self, request_id, pcm):
            self.sent += len(pcm)

        def words(self, request_id, timings):
            self.timed += [(start, self.sent / rate) for start in timings.start]

        def finished(self, request_id, *args):
            self.done = True

        def failed(self, request_id, error):
            self.done = True

    speaker = Speaker()
    runner = AligningRunner(speaker, aligner)
    early_ms, late_ms, leads = [], [], []
    words_total = words_early = requests_short = 0
    for i in range(0, len(sentences) - args.join + 1, args.join):
        text = " ".join(sentences[i : i + args.join])
        pcm, events = synthesise(espeak, text)
        reference = reference_starts(text, events, rate)
        speaker.chunks = [pcm[k : k + chunk] for k in range(0, len(pcm), chunk)]
        sink = Sink()
        runner.add(SpeechRequest(request_id="r", text=text, word_timestamps=True))
        while not sink.done:
            runner.step(sink)
            while runner._in_flight and runner._results.empty():  # an aligner that keeps up
                time.sleep(0.0005)
        duration = len(pcm) / rate
        words_total += len(reference)
        requests_short += len(sink.timed) < len(reference)
        for (start, sent), truth in zip(sink.timed, reference, strict=False):
            before_end = sent < duration
            words_early += before_end
            leads.append(duration - sent)
            if truth is not None:
                (early_ms if before_end else late_ms).append(abs(start - truth) * 1000)
    runner.close()
    return {
        "requests": len(range(0, len(sentences) - args.join + 1, args.join)), "sentences_per_request": args.join,
        "chunk_s": args.chunk, "words": words_total, "requests_without_every_timing": requests_short,
        "committed_while_speaking": _error_figures(early_ms), "aligned_at_the_end": _error_figures(late_ms),
        "all": _error_figures(early_ms + late_ms),
        "share_committed_before_the_end": round(words_early / max(words_total, 1), 3),
        "mean_lead_s": round(float(np.mean(leads)), 2) if leads else None,  # all words with a timing
        "mean_lead_s_of_those_before_the_end": round(float(np.mean([x for x in leads if x > 0] or [0])), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aligner", default="pocketsphinx", help="'pocketsphinx' or a Qwen3-ForcedAligner directory")
    parser.add_argument("--device", default="auto", help="Qwen3 aligner: cpu, cuda, cuda:N (default: cuda if present)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="Qwen3 aligner precision (default: bfloat16 on CUDA, float32 on the CPU)")
    parser.add_argument("--graphs", default="auto", choices=("auto", "0", "1"),
                        help="Qwen3 aligner: its forward from CUDA graphs (auto: on CUDA; 0: eager)")
    parser.add_argument("--fused", default="auto", choices=("auto", "0", "1"),
                        help="Qwen3 aligner: its text layers fused and compiled (auto: on CUDA; 0: plain layers)")
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--voice", default="en-us")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--latency", action="store_true", help="time batches of clauses instead of accuracy")
    parser.add_argument("--streaming", action="store_true", help="the runner's incremental path instead")
    parser.add_argument("--join", type=int, default=4, help="--streaming: corpus sentences per request")
    parser.add_argument("--chunk", type=float, default=0.2, help="--streaming: seconds of audio per chunk")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16], help="--latency: clauses per batch")
    parser.add_argument("--warmup", type=int, default=10, help="--latency: untimed batches first")
    parser.add_argument("--iterations", type=int, default=100, help="--latency: timed batches")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    sentences = [line.strip() for line in open(args.corpus, encoding="utf-8") if line.strip()][: args.limit]
    espeak = EspeakLibrary()
    espeak.set_voice(args.voice)
    aligner = load_aligner(args.aligner, espeak, args.device, args.dtype, args.graphs, args.fused)
    figures = {"aligner": args.aligner}
    if hasattr(aligner, "device"):
        figures.update(device=str(aligner.device), dtype=str(aligner.dtype).removeprefix("torch."),
                       graphs=args.graphs, fused=args.fused)
    measure = latency if args.latency else streaming if args.streaming else accuracy
    figures.update(measure(args, sentences, espeak, aligner))
    if getattr(aligner, "graphed", None) is not None:
        figures["graph_buckets"] = len(aligner.graphed.buckets)
    figures["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}"
    if figures.get("device", "").startswith("cuda"):
        import torch

        figures["gpu"] = torch.cuda.get_device_name(figures["device"])
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Word-alignment accuracy and cost: an aligner's word starts against eSpeak NG's own word events.

eSpeak reports the exact sample where it starts each word (`streamvox.models.espeak.word_timing`),
so its audio comes with ground truth. For every sentence of a fixed English corpus (numbers and
abbreviations included), the sentence is synthesised once, and the aligner aligns that audio with
the sentence's text. Only words with an eSpeak event of their own are scored.

Reports the mean, p50, p90 and p95 absolute error of word starts (targets: mean <= 20 ms,
p95 <= 50 ms), how many sentences failed to align, and the aligner's CPU time per second of audio
(one thread). Example:

  python benchmarks/alignment_bench.py --aligner pocketsphinx
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
from streamvox.models.alignment.pocketsphinx_aligner import AlignmentFailed, PocketsphinxAligner  # noqa: E402
from streamvox.models.espeak.library import EVENT_WORD, EspeakLibrary  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "corpus", "english_sentences.txt")
TARGET_MEAN_MS, TARGET_P95_MS = 20.0, 50.0


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aligner", default="pocketsphinx", choices=("pocketsphinx",))
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--voice", default="en-us")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    sentences = [line.strip() for line in open(args.corpus, encoding="utf-8") if line.strip()][: args.limit]
    espeak = EspeakLibrary()
    espeak.set_voice(args.voice)
    rate = espeak.sample_rate
    aligner = PocketsphinxAligner(espeak.phonemes)

    errors_ms: list[float] = []
    failed: list[str] = []
    cpu_s = audio_s = 0.0
    for text in sentences:
        events, parts = [], []
        espeak.synthesize(text, lambda pcm, parts=parts: parts.append(pcm) or True, events)
        pcm = np.concatenate(parts).astype(np.float32) / 32768.0
        words = text.split()
        reference = reference_starts(text, events, rate)
        audio_s += len(pcm) / rate
        started = time.process_time()
        try:
            spans = aligner.align(pcm, rate, words)
        except AlignmentFailed:
            failed.append(text)
            continue
        finally:
            cpu_s += time.process_time() - started
        errors_ms += [abs(start - truth) * 1000 for (start, _), truth in zip(spans, reference, strict=True)
                      if truth is not None]

    errors = np.array(errors_ms)
    figures = {
        "aligner": args.aligner,
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
        "targets": {"mean_abs_error_ms": TARGET_MEAN_MS, "p95_ms": TARGET_P95_MS},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
    }
    print(json.dumps(figures, indent=2))
    for text in failed:
        print("failed to align:", text, file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=2)
    met = figures["mean_abs_error_ms"] <= TARGET_MEAN_MS and figures["p95_ms"] <= TARGET_P95_MS
    print("targets met" if met else "targets NOT met", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The alignment benchmark runs end to end on a few sentences of its corpus and reports its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_alignment_bench_reports_errors_and_cost(tmp_path):
    corpus = [line for line in (ROOT / "benchmarks/corpus/english_sentences.txt").read_text().splitlines() if line]
    assert len(corpus) >= 200 and any(c.isdigit() for c in "".join(corpus)) and "Dr." in "".join(corpus)
    out = tmp_path / "figures.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/alignment_bench.py"), "--limit", "6", "--json", str(out)],
                   check=True, capture_output=True, timeout=120)
    figures = json.loads(out.read_text())
    assert figures["sentences"] == 6 and figures["words_scored"] > 30
    assert 0 <= figures["mean_abs_error_ms"] <= figures["p95_ms"] and 0 < figures["cpu_s_per_audio_s"] < 1


def test_alignment_bench_times_batches_of_clauses_with_the_qwen3_aligner(tmp_path):
    """The latency mode on the CPU with a tiny checkpoint: what the GPU run does, at toy size."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers.qwen3_aligner_tiny import build_tiny_aligner

    aligner = build_tiny_aligner(tmp_path / "tiny-aligner")
    out = tmp_path / "latency.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/alignment_bench.py"), "--aligner", str(aligner),
                    "--device", "cpu", "--latency", "--streams", "1", "4", "--warmup", "1", "--iterations", "3",
                    "--limit", "40", "--json", str(out)], check=True, capture_output=True, timeout=300)
    figures = json.loads(out.read_text())
    assert figures["device"] == "cpu" and figures["clauses"] > 4 and 2 <= figures["mean_clause_s"] <= 4
    for streams in ("1", "4"):
        row = figures["streams"][streams]
        assert row["batches"] == 3 and row["failed_clauses"] == 0
        assert 0 < row["p50_ms_per_batch"] <= row["p95_ms_per_batch"]

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

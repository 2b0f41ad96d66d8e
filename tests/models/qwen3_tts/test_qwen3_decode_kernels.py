"""The frame step's Triton decode kernels (kernels/triton_decode/), run on the CPU by Triton's interpreter in a
subprocess (decode_kernels_job.py): each kernel against the torch ops it replaces, and frame steps of four
rows and of one row with the kernels against the same steps with the torch layers, a subprocess each (under
the interpreter a frame step takes minutes). On a GPU, benchmarks/gpu_bench.py --check compares the compiled
kernels the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "tests" / "helpers" / "decode_kernels_job.py"
pytestmark = pytest.mark.timeout(600)  # each part took 55-175 s on a quiet 2-core machine


def _job(tmp_path: Path, part: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(JOB.parent), str(REPO)]))
    proc = subprocess.run([sys.executable, str(JOB), str(tmp_path / "ckpt"), part],
                          env=env, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.rstrip().endswith("ok")
    return proc.stdout


def test_decode_kernels_match_torch_ops(tmp_path) -> None:
    out = _job(tmp_path, "kernels")
    assert "split_attend: max abs error" in out and "sample_scores: identical choices" in out


def test_frame_step_with_kernels_matches_torch_layers(tmp_path) -> None:
    assert "frame step: codes identical" in _job(tmp_path, "step")


def test_sampled_frame_step_with_kernels_matches_torch_layers(tmp_path) -> None:
    assert "sampled frame step: codes identical" in _job(tmp_path, "sampled-step")


def test_one_row_frame_step_with_kernels_matches_torch_layers(tmp_path) -> None:
    assert "one row: codes identical" in _job(tmp_path, "one-row")

"""The frame step's Triton decode kernels (decode_kernels.py), run on the CPU by Triton's interpreter in a
subprocess (decode_kernels_job.py): each kernel against the torch ops it replaces, and two frame steps
with the kernels against the same steps with the torch layers. On a GPU, benchmarks/gpu_bench.py --check
compares the compiled kernels the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_decode_kernels_match_torch_layers(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    proc = subprocess.run([sys.executable, str(HERE / "decode_kernels_job.py"), str(tmp_path / "ckpt")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "frame step: codes identical" in proc.stdout and proc.stdout.rstrip().endswith("ok")

"""Shared helpers for the Qwen3-TTS tests: run our runner to completion, run the reference."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from streamvox.contract import RequestError, SpeechRequest
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner

REPO = Path(__file__).resolve().parents[2]
# Tiny models: one thread avoids oversubscribing a small shared CI machine (and is faster here).
torch.set_num_threads(1)


def reference_python() -> str:
    """The reference venv's python (STREAMVOX_REF_PYTHON, default `.ref-venv/bin/python`); fails if absent."""
    path = Path(os.environ.get("STREAMVOX_REF_PYTHON", ".ref-venv/bin/python"))
    if not path.is_absolute():
        path = REPO / path
    if not path.exists():
        pytest.fail(
            f"reference python {path} not found: create it with scripts/setup_reference_venv.sh <dir> "
            "and point STREAMVOX_REF_PYTHON at <dir>/bin/python"
        )
    return str(path)


def run_reference(jobs: list[dict]) -> list[dict]:
    """Run reference jobs ({"model_dir", "cases", ...}) in one subprocess; one result per job."""
    job = {"jobs": [{**j, "model_dir": str(j["model_dir"])} for j in jobs]}
    proc = subprocess.run(
        [reference_python(), str(REPO / "tests" / "helpers" / "qwen3_reference_job.py")],
        input=json.dumps(job), capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""},
    )
    if proc.returncode != 0:
        pytest.fail(f"reference run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["results"]


@dataclass
class RecordingSink:
    audio_chunks: dict[str, list[np.ndarray]] = field(default_factory=dict)
    done: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    errors: dict[str, RequestError] = field(default_factory=dict)

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        self.audio_chunks.setdefault(request_id, []).append(pcm)

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        self.done[request_id] = (reason, input_tokens, output_tokens)

    def failed(self, request_id: str, error: RequestError) -> None:
        self.errors[request_id] = error


class FrameLog:
    def __init__(self) -> None:
        self.frames: dict[str, list[list[int]]] = {}

    def __call__(self, rid: str, frame: torch.Tensor) -> None:
        self.frames.setdefault(rid, []).append(frame.tolist())


def drain(runner: Qwen3TTSRunner, sink: RecordingSink, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not runner.has_work():
            return
        runner.step(sink)
    raise AssertionError("runner did not finish")


def run_solo(runner: Qwen3TTSRunner, log: FrameLog, request: SpeechRequest, words: bool = False) -> list:
    """Run one request alone; with `words`, its text arrives one word per step."""
    sink = RecordingSink()
    if words:
        pieces = _words(request.text)
        runner.add(_with(request, text="", text_complete=False))
        for piece in pieces:
            runner.feed_text(request.request_id, piece)
            runner.step(sink)
        runner.end_input(request.request_id)
    else:
        runner.add(request)
    drain(runner, sink)
    assert request.request_id in sink.done, sink.errors
    return log.frames.pop(request.request_id, [])


def _words(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text:
        if ch.isspace() and cur and not cur[-1].isspace():
            out.append(cur)
            cur = ""
        cur += ch
    if cur:
        out.append(cur)
    return out


def _with(r: SpeechRequest, **kw) -> SpeechRequest:
    import msgspec

    return msgspec.structs.replace(r, **kw)


def pcm_bytes(pcm: np.ndarray) -> bytes:
    return pcm.astype("<f4").tobytes()


def make_signal(sr: int, seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    sig = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 517 * t)
    sig = sig + 0.05 * rng.standard_normal(t.size)
    return sig.astype(np.float32)

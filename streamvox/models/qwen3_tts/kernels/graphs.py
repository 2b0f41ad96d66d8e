"""CUDA-graph helpers and stream priorities shared by the frame stepper (`runtime/fast_path.py`), the slot
decoder (`codec/graphed.py`) and the GPU word aligner (`alignment/qwen3_aligner/graphed.py`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

# CUDA stream priorities (lower runs first: the scheduler gives freed SMs to the waiting kernels of the
# highest-priority stream). Frame steps pace every stream's audio, the decoder turns their frames into it,
# and word alignment is background work, at CUDA's lowest priority (0).
AR_PRIORITY, DECODER_PRIORITY, BACKGROUND_PRIORITY = -2, -1, 0

# Held while a graph is captured. A "global" capture fails if another thread of the process allocates
# or synchronises meanwhile, so a thread that runs CUDA work beside the engine's (the GPU word aligner)
# holds it for that work, its own captures included (hence reentrant).
CAPTURE_LOCK = threading.RLock()


def copy_from_host(dst: torch.Tensor, host: torch.Tensor) -> None:
    """Copy a host tensor into device buffer `dst` without a host sync (pinned staging on CUDA)."""
    dst.copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=True)


def capture_graph(fn: Callable[[], T], pool: Any, mode: str = "global") -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `fn` up twice on a side stream (lazy initialisation, cuBLAS workspaces, compiles), then
    capture one call into a CUDA graph allocating from memory pool `pool`; returns the graph and that
    call's output (static: each replay overwrites it). `mode` "thread_local": other threads keep
    running CUDA work during the capture (only this thread's unsafe calls are forbidden)."""
    with CAPTURE_LOCK:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode=mode):
            out = fn()
    return graph, out

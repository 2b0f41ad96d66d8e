"""Building the one-launch CUDA kernels (`predictor_kernel.cu`, `talker_kernel.cu`, with `persistent.cuh`) and
deciding whether a frame stepper uses one."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
K = TypeVar("K")


@functools.cache
def build(source: str):
    """The extension built from `source` (a file beside this one) with the CUDA compiler through
    `torch.utils.cpp_extension` (15-20 s, then cached). Its name carries a digest of the source and the shared
    header, so an edited header is rebuilt too."""
    from torch.utils.cpp_extension import load

    text = (HERE / source).read_bytes() + (HERE / "persistent.cuh").read_bytes()
    name = f"streamvox_{Path(source).stem}_{hashlib.sha256(text).hexdigest()[:12]}"
    return load(name=name, sources=[str(HERE / source)], extra_include_paths=[str(HERE)],
                extra_cuda_cflags=["-O3", "-std=c++17"], verbose=False)


def optional(env: str, what: str, why: str | None, make: Callable[[], K]) -> K | None:
    """`make()`, or None where env var `env` is 0, the model is unsupported (`why`), or `make` fails (it builds
    the kernel). `env` 1 requires the kernel: an unsupported model or a failure raises."""
    setting = os.environ.get(env, "auto")
    if setting == "0":
        return None
    if why is not None:
        if setting == "1":
            raise RuntimeError(f"{what}: {why}")
        log.info("%s not used: %s", what, why)
        return None
    try:
        return make()
    except Exception:
        if setting == "1":
            raise
        log.exception("%s unavailable; one-row steps keep the per-layer kernels", what)
        return None

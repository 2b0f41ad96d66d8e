"""Building the one-launch CUDA kernels (`predictor_kernel.cu`, `talker_kernel.cu`, with `persistent.cuh`) and
deciding whether a frame stepper uses one."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
K = TypeVar("K")


def compile_extension(prefix: str, source: Path, defines: tuple[tuple[str, int], ...] = ()):
    """The extension built from `source` (beside it: `persistent.cuh`) with the CUDA compiler through
    `torch.utils.cpp_extension` (15-20 s, then cached), each of `defines` a `-DNAME=VALUE`. Its name is `prefix`
    and a digest of the source, the shared header and the defines, so an edited header is rebuilt too."""
    from torch.utils.cpp_extension import load

    flags = [f"-D{name}={value}" for name, value in defines]
    text = source.read_bytes() + (source.parent / "persistent.cuh").read_bytes() + " ".join(flags).encode()
    return load(name=f"{prefix}_{hashlib.sha256(text).hexdigest()[:12]}", sources=[str(source)],
                extra_include_paths=[str(source.parent)], extra_cuda_cflags=["-O3", "-std=c++17", *flags],
                verbose=False)


@functools.cache
def build(source: str, defines: tuple[tuple[str, int], ...] = ()):
    """The extension of `source`, a kernel beside this file, compiled with `defines` (compile_extension)."""
    return compile_extension(f"streamvox_{Path(source).stem}", HERE / source, defines)


def kernel_grid(multiprocessors: int, decoder_sms: str = "0") -> int:
    """Blocks a one-launch kernel runs, one a multiprocessor: all `multiprocessors` but `decoder_sms`
    (`Qwen3Settings.decoder_sms`, env STREAMVOX_QWEN3_DECODER_SMS) left free. Each block fills its multiprocessor's
    shared memory for the whole launch, so the codec decoder's kernels (on their low-priority stream) run beside a
    launch only on the multiprocessors it leaves free; with none free they run between launches, in the AR stage's
    time. Raises ValueError for a value that is not a whole number below `multiprocessors`."""
    if not decoder_sms.isdigit() or int(decoder_sms) >= multiprocessors:
        raise ValueError(f"STREAMVOX_QWEN3_DECODER_SMS={decoder_sms!r}: a whole number from 0 to "
                         f"{multiprocessors - 1} (this GPU has {multiprocessors} multiprocessors)")
    return multiprocessors - int(decoder_sms)


def shape_mismatch(cfg, shape: dict[str, int], what: str) -> str | None:
    """The first of `cfg`'s sizes that differs from the kernel's `shape`, as a reason (None: all match)."""
    for name, want in shape.items():
        if getattr(cfg, name) != want:
            return f"{what} {name} {getattr(cfg, name)} (the kernel is built for {want})"
    return None


def device_unsupported(model) -> str | None:
    """Why a one-launch kernel cannot run on `model`'s weights and device (None: it can)."""
    if model.dtype != torch.bfloat16:
        return f"dtype {model.dtype} (the kernel reads bfloat16 weights)"
    if model.device.type != "cuda":
        return "not on CUDA"
    if torch.cuda.get_device_capability(model.device) < (9, 0):
        return "compute capability below 9.0 (no bulk copies)"
    return None


LAYER_WEIGHTS = ("w_ln", "w_qkv", "w_qn", "w_kn", "w_o", "w_ln2", "w_gu", "w_down")


def layer_weights(stack) -> list[torch.Tensor]:
    """A fused stack's layer weights in the kernels' order (LAYER_WEIGHTS, layer after layer)."""
    return [layer[name] for layer in stack.layers for name in LAYER_WEIGHTS]


def pointers(tensors: list[torch.Tensor], what: str) -> list[int]:
    """The tensors' addresses for a kernel that reads them in 16-byte pieces; raises unless each is contiguous
    and 16-byte aligned."""
    for t in tensors:
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{what}: weights and caches must be contiguous and 16-byte aligned")
    return [t.data_ptr() for t in tensors]


def optional(setting: str, what: str, why: str | None, make: Callable[[], K]) -> K | None:
    """`make()`, or None where `setting` is "0", the model is unsupported (`why`), or `make` fails (it builds
    the kernel). `setting` "1" requires the kernel: an unsupported model or a failure raises; "auto" uses it
    where it can."""
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

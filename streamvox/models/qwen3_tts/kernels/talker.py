"""The talker's decoder layers at one new position of one row, in one CUDA launch (`talker_kernel.cu`).

At one stream the talker's 28 layers were 140 dependent launches a frame step (q/k/v, attention, output,
gate/up, down), each starting to stream its weights only when the previous one had finished, and reading
them at 60-75% of the memory bandwidth. This kernel runs the 28 layers in one launch of one block per
multiprocessor, five grid-wide barriers a layer, each block streaming its share of every projection's
weights through a ring of shared-memory slots that a warp of its own refills with the bulk-copy engine as soon
as the computing warps are done with one, so the weight stream runs on across the barriers, the input loads and
the attention.

On an H200 (1.7B shapes) the kernel alone takes 1.28 ms (a CUDA graph) against ~0.67 ms to read its weights,
the one-row frame step 3.04 ms against 3.16 with the per-layer kernels, and the one-stream RTF is 0.0405 with the
predictor's kernel (benchmarks/HISTORY.md, session 25).

Used for one-row frame steps of the released talkers' shapes (1.7B and 0.6B: the build sets the hidden and MLP
sizes), bfloat16 weights, on
GPUs with the bulk-copy engine (compute capability 9.0) and enough shared memory; anything else, or a failed
build, keeps the per-layer Triton kernels (`runtime/fast_path.FrameStepper`). `Qwen3Settings.talker_kernel`
(env STREAMVOX_QWEN3_TALKER_KERNEL): 0 never, 1 required (a failure raises), default auto. Like the predictor's
kernel it needs every block resident at once (see kernels/predictor.py), and runs one block on every
multiprocessor but those that `Qwen3Settings.decoder_sms` leaves to the codec decoder (`build.kernel_grid`).
"""

from __future__ import annotations

import torch

from streamvox.models.qwen3_tts.kernels.build import (
    build,
    device_unsupported,
    kernel_grid,
    layer_weights,
    optional,
    pointers,
    shape_mismatch,
)

# The shapes common to the talkers the kernel is compiled for (its constexprs), and each one's MLP width by its
# hidden size (TALKER_HIDDEN and TALKER_INTER in the build)
SHAPE = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_hidden_layers=28)
INTERMEDIATE = {2048: 6144, 1024: 3072}  # the released 1.7B and 0.6B talkers
MAX_SPAN = 256  # positions one block of the attention takes at most (talker_kernel.cu)


def unsupported(model, max_len: int, decoder_sms: str = "0") -> str | None:
    """Why the kernel cannot run `model`'s talker over a cache of `max_len` positions (None: it can)."""
    tc = model.cfg.talker
    why = shape_mismatch(tc, SHAPE, "talker") or device_unsupported(model)
    if INTERMEDIATE.get(tc.hidden_size) != tc.intermediate_size:
        why = (f"talker hidden_size {tc.hidden_size} with intermediate_size {tc.intermediate_size} (the kernel is "
               f"built for {', '.join(f'{h} with {i}' for h, i in INTERMEDIATE.items())})")
    if why is not None:
        return why
    sms = torch.cuda.get_device_properties(model.device).multi_processor_count
    groups = kernel_grid(sms, decoder_sms) // SHAPE["num_key_value_heads"]
    if max_len > groups * MAX_SPAN:
        return f"a cache of {max_len} positions (at most {groups * MAX_SPAN} on this GPU)"
    return None


class TalkerLayers:
    """The talker's layers for one row of a `FrameStepper`, in one launch."""

    def __init__(self, model, tstack, cache, decoder_sms: str = "0") -> None:
        tc = model.cfg.talker
        sizes = (("TALKER_HIDDEN", tc.hidden_size), ("TALKER_INTER", tc.intermediate_size))
        self.ext = build("talker_kernel.cu", sizes)
        assert self.ext.max_span() == MAX_SPAN
        dev = model.device
        self.grid = kernel_grid(torch.cuda.get_device_properties(dev).multi_processor_count, decoder_sms)
        self.shared_bytes = self.ext.prepare()  # raises if the device's limit is too low
        h, hd, nh, nkv = tc.hidden_size, tc.head_dim, tc.num_attention_heads, tc.num_key_value_heads
        bf = dict(dtype=torch.bfloat16, device=dev)
        self.x = torch.empty(h, **bf)  # the output
        self.scratch = [torch.empty((nh + 2 * nkv) * hd, **bf), torch.empty(nh * hd, **bf),
                        torch.empty(tc.intermediate_size, **bf),
                        torch.empty(self.grid * (nh // nkv) * (hd + 2), dtype=torch.float32, device=dev),
                        torch.zeros(1 + nkv, dtype=torch.int32, device=dev)]
        self.inv_freq = tstack.inv_freq.contiguous()
        k, v = cache.k, cache.v
        self.ptrs = pointers(layer_weights(tstack) + [k, v], "talker kernel")
        self.tail = [self.inv_freq.data_ptr()]
        self.out_ptrs = [self.x.data_ptr()] + [t.data_ptr() for t in self.scratch]
        self.ints = [k.stride(0), k.stride(1), k.stride(2), k.stride(3), k.shape[3], self.grid]
        self.floats = [tstack.eps, hd**-0.5]

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The layers' output `[1, H]` (before the final norm) for input `x` `[H]` at position `pos[0]` of cache
        slot `slot[0]` (int64 device tensors), whose key and value go into the cache there."""
        assert x.is_contiguous() and x.numel() == self.x.numel() and x.dtype == torch.bfloat16
        assert pos.dtype == slot.dtype == torch.int64
        ptrs = self.ptrs + [pos.data_ptr(), slot.data_ptr()] + self.tail + [x.data_ptr()] + self.out_ptrs
        self.ext.launch(ptrs, self.ints, self.floats, torch.cuda.current_stream(x.device).cuda_stream)
        return self.x.view(1, -1)


def talker_layers(model, tstack, cache, setting: str = "auto", decoder_sms: str = "0") -> TalkerLayers | None:
    """The one-launch talker layers for this model and cache, or None (unsupported, switched off by `setting`
    "0", or the build failed; `setting` "1" raises instead)."""
    return optional(setting, "talker kernel", unsupported(model, cache.k.shape[3], decoder_sms),
                    lambda: TalkerLayers(model, tstack, cache, decoder_sms))

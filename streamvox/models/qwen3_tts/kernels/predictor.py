"""The code predictor's single-position passes for one row in one CUDA launch (`predictor_kernel.cu`).

At one stream a frame step is ~550 dependent launches, and the 14 single-position predictor passes are most
of them (27 each: 5 layers of 5, the head, the greedy choice with its embedding projected). Each launch
starts streaming its weights only when the previous one has finished, so a layer of 30 MB took ~29 us
against ~7.5 us of reading (H200). This kernel runs all 14 passes in one launch of one block per
multiprocessor, phases separated by grid-wide barriers (21 a pass: every block computes the whole attention
itself, and the next pass's input is looked up in a table of the code embeddings already projected, built
here once), each block copying its share of the next projection's weights into shared memory while the
current phase (once its input is loaded) and its barrier run.

On an H200 (1.7B shapes, the talker on its per-layer kernels) it takes the one-row frame step from 3.56 to
3.05 ms (the kernel alone 1.51 ms; benchmarks/HISTORY.md, sessions 18, 21, 22 and 25).

Built at first use with the CUDA compiler through `torch.utils.cpp_extension` (15-20 s, then cached);
used for one-row frame steps of the shapes it is written for (the released 0.6B and 1.7B code predictors),
bfloat16 weights, on GPUs with the bulk-copy engine (compute capability 9.0) and enough shared memory. Anything
else, or a failed build, keeps the per-layer Triton kernels (`runtime/fast_path.FrameStepper`).
`Qwen3Settings.predictor_kernel` (env STREAMVOX_QWEN3_PREDICTOR_KERNEL): 0 never, 1 required (a failure raises),
default auto.

The barriers need every block resident at once (one per multiprocessor, which an otherwise idle GPU gives:
other kernels only delay the launch; `Qwen3Settings.decoder_sms` leaves some multiprocessors to the codec
decoder, `build.kernel_grid`). A GPU shared through MPS with another program that also keeps blocks
resident while it waits could deadlock both; turn the kernel off there.
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

# The shapes the kernel is compiled for (its constexprs): hidden, heads, kv heads, head dim, MLP width,
# layers, codes per codebook
SHAPE = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
             num_hidden_layers=5, vocab_size=2048)
MAX_GROUPS = 16


def unsupported(model) -> str | None:
    """Why the kernel cannot run `model`'s code predictor (None: it can). Needs no GPU."""
    why = shape_mismatch(model.talker.code_predictor.cfg, SHAPE, "code predictor")
    if why is not None:
        return why
    groups = model.cfg.talker.num_code_groups
    if not 2 < groups <= MAX_GROUPS:
        return f"{groups} code groups"
    ht = model.cfg.talker.hidden_size
    proj = model.talker.code_predictor.small_to_mtp_projection
    if not isinstance(proj, torch.nn.Linear) and ht != SHAPE["hidden_size"]:
        return f"projection {type(proj).__name__}"
    if ht % 8:
        return f"talker hidden size {ht}"
    return device_unsupported(model)


class PredictorPasses:
    """Passes 1..groups-2 of the code predictor for row 0 (cache slot 0) of a `FrameStepper`, in one launch."""

    def __init__(self, model, pstack, pk: torch.Tensor, pv: torch.Tensor, decoder_sms: str = "0") -> None:
        self.ext = build("predictor_kernel.cu")
        dev = model.device
        cp = model.talker.code_predictor
        self.groups = model.cfg.talker.num_code_groups
        self.ht = model.cfg.talker.hidden_size
        self.grid = kernel_grid(torch.cuda.get_device_properties(dev).multi_processor_count, decoder_sms)
        self.shared_bytes = self.ext.prepare(self.grid)  # raises if the device's limit is too low
        bf = dict(dtype=torch.bfloat16, device=dev)
        self.scratch = dict(qkv=torch.empty(4096, **bf), act=torch.empty(3072, **bf),
                            part_val=torch.empty(self.grid, dtype=torch.float32, device=dev),
                            part_idx=torch.empty(self.grid, dtype=torch.int32, device=dev),
                            counter=torch.zeros(1, dtype=torch.int32, device=dev))
        first, last = 1, self.groups - 2
        heads = [cp.lm_head[j].weight for j in range(self.groups - 1)]
        tables = [cp.model.codec_embedding[j].weight for j in range(self.groups - 1)]
        self.next_in = self._projected(cp.small_to_mtp_projection, tables[first:last])
        self.inv_freq = pstack.inv_freq.contiguous()
        s = self.scratch
        self.head_ptrs = (pointers(layer_weights(pstack) + [pstack.norm_w, pk, pv], "predictor kernel")
                          + [self.inv_freq.data_ptr()])
        self.scratch_ptrs = [s["qkv"].data_ptr(), s["act"].data_ptr(), s["part_val"].data_ptr(),
                             s["part_idx"].data_ptr()]
        self.table_ptrs = (pointers(heads + tables, "predictor kernel") + [0] * first
                           + pointers(list(self.next_in), "predictor kernel") + [0] * (self.groups - 1 - last))
        self.ints = [pk.stride(0), pk.stride(2), pk.stride(3), first, last, self.ht, self.grid]
        self.floats = [pstack.eps, pstack.norm_eps, pstack.hd**-0.5]

    @staticmethod
    def _projected(proj, tables: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """Each table's rows through the projection into the predictor's width (float64, rounded once), or
        the tables themselves where the projection is the identity."""
        if not isinstance(proj, torch.nn.Linear):
            return tables
        w = proj.weight.double()
        b = proj.bias.double() if proj.bias is not None else 0.0
        return torch.stack([(t.double() @ w.T + b).to(torch.bfloat16) for t in tables])

    def __call__(self, x: torch.Tensor, frames: torch.Tensor, total: torch.Tensor) -> None:
        """From pass 1's input `x` `[H]` (overwritten): codes 2..groups-1 into `frames` `[groups]` (int64) and
        their embeddings added to `total` `[HT]`, the frame's embedding sum, as `FrameStepper._predict_rows`."""
        for t, n in ((x, SHAPE["hidden_size"]), (frames, self.groups), (total, self.ht)):
            assert t.is_contiguous() and t.numel() == n
        assert x.dtype == total.dtype == torch.bfloat16 and frames.dtype == torch.int64
        ptrs = self.head_ptrs + [x.data_ptr()] + self.scratch_ptrs + [
            frames.data_ptr(), total.data_ptr(), self.scratch["counter"].data_ptr()] + self.table_ptrs
        self.ext.launch(ptrs, self.ints, self.floats, torch.cuda.current_stream(x.device).cuda_stream)


def predictor_passes(model, pstack, pk: torch.Tensor, pv: torch.Tensor, setting: str = "auto",
                     decoder_sms: str = "0") -> PredictorPasses | None:
    """The one-launch passes for this model, or None (unsupported, switched off by `setting` "0", or the build
    failed; `setting` "1" raises instead)."""
    return optional(setting, "predictor kernel", unsupported(model),
                    lambda: PredictorPasses(model, pstack, pk, pv, decoder_sms))

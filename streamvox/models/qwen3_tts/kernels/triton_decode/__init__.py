"""Triton kernels for one decode position per row: a decoder layer in five or six launches.

The frame step runs 103 decoder layers per frame (28 talker + 15 code-predictor passes of 5), one
position per row: ~550 dependent kernels of a few microseconds each (one row, counted from the code),
whose time is set by how quickly each one gets its weight streaming, not by the step's total bytes.
Here a layer is

1. `linear(x, W_qkv, norm=input_layernorm)`: RMSNorm fused into the q/k/v projection;
2. `qk_norm_rope_store`: q/k head norms, RoPE from the positions, keys/values written to the cache;
3. `decode_attention`: each row's query heads over its cache slot, keys `[0, pos]`;
4. `linear(attn, W_o, residual=x)`;
5. `linear(x, W_gate_up, norm=post_attention_layernorm, swiglu=True)`;
6. `linear(mlp, W_down, residual=x)`.

`matmul.py` holds the GEMMs and what fuses into them (1, 4-6, the greedy choices between passes),
`attention.py` the rest (2, 3, and both in one launch).

Rows are tokens: row `m` writes its key/value at `pos[m]` of cache slot `slot[m]` and attends to
positions `[0, pos[m]]` of that slot, so the code predictor's first pass (two positions per request) is
two rows with the same slot. Arithmetic is float32 inside each kernel with the input dtype at its
boundaries; `tests` and `benchmarks/gpu_bench.py --check` compare it with the torch layers.
"""

from streamvox.models.qwen3_tts.kernels.triton_decode.attention import (
    decode_attention,
    qk_norm_rope_store,
    rope_attend,
    split_attend,
)
from streamvox.models.qwen3_tts.kernels.triton_decode.matmul import (
    choose_commit,
    linear,
    rms_norm,
    select_rows,
    swiglu_rows,
)

__all__ = ["choose_commit", "decode_attention", "linear", "qk_norm_rope_store", "rms_norm", "rope_attend",
           "select_rows", "split_attend", "swiglu_rows"]

"""A decoder stack's layers in few launches, for the fast path's frame step and prefill (`fast_path.FrameStepper`).

`FusedStack` concatenates each layer's q/k/v and gate/up weights (fewer, larger GEMMs) and runs a layer either as
two fused torch halves (`_pre_attn`: norm, one q/k/v GEMM, q/k norms, RoPE; `_post_attn`: output projection,
norm, one gate/up GEMM, SwiGLU), compiled with `torch.compile` on CUDA (dynamic batch), or, one position per row,
as five or six Triton launches (`FusedStack.layer_rows`, `kernels/triton_decode/`; from `matmul.CUBLAS_MIN_ROWS`
rows the GEMMs are cuBLAS calls between them).
"""

from __future__ import annotations

from importlib.util import find_spec

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rope(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * c + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * s


def _pre_attn(x, w_ln, w_qkv, w_qn, w_kn, cos, sin, eps: float, nh: int, nkv: int, hd: int):
    """Input norm, fused q/k/v projection, q/k norms, RoPE: the same arithmetic as `model/modules.py`'s Attention."""
    b, length, _ = x.shape
    h = _rms(x, w_ln, eps)
    q, k, v = F.linear(h, w_qkv).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = _rms(q.reshape(b, length, nh, hd), w_qn, eps).transpose(1, 2)
    k = _rms(k.reshape(b, length, nkv, hd), w_kn, eps).transpose(1, 2)
    v = v.reshape(b, length, nkv, hd).transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rope(q, c, s), _rope(k, c, s), v


def _post_attn(x, attn, w_o, w_ln2, w_gu, w_down, eps: float, inter: int):
    """Output projection + residual, post-attention norm, fused gate/up SwiGLU MLP + residual."""
    b, length, _ = x.shape
    x = x + F.linear(attn.transpose(1, 2).reshape(b, length, -1), w_o)
    g, u = F.linear(_rms(x, w_ln2, eps), w_gu).split([inter, inter], dim=-1)
    return x + F.linear(F.silu(g) * u, w_down)


@torch.no_grad()
def _concat_in_place(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """The linears' weights concatenated along the output dimension, each weight then re-pointed at its
    rows of the concatenation (the module computes as before; the separate copies are freed)."""
    fused = torch.cat([lin.weight for lin in linears])
    for lin, rows in zip(linears, fused.split([lin.weight.shape[0] for lin in linears]), strict=True):
        lin.weight.data = rows
    return fused


class FusedStack:
    """A decoder stack's weights with q/k/v and gate/up concatenated (fewer, larger GEMMs). The layers' own
    q/k/v and gate/up parameters become views of the concatenations, so fusing costs no extra memory."""

    def __init__(self, stack, fns, kernels=None) -> None:
        self.layers = []
        for layer in stack.layers:
            a, m = layer.self_attn, layer.mlp
            if a.q_proj.bias is not None:
                raise ValueError("fused stack: attention biases are not supported")
            self.layers.append(dict(
                w_ln=layer.input_layernorm.weight, w_qkv=_concat_in_place([a.q_proj, a.k_proj, a.v_proj]),
                w_qn=a.q_norm.weight, w_kn=a.k_norm.weight, w_o=a.o_proj.weight,
                w_ln2=layer.post_attention_layernorm.weight, w_gu=_concat_in_place([m.gate_proj, m.up_proj]),
                w_down=m.down_proj.weight,
            ))
        a0 = stack.layers[0].self_attn
        self.eps = stack.layers[0].input_layernorm.eps
        self.nh, self.nkv, self.hd = a0.heads, a0.kv_heads, a0.head_dim
        self.inter = stack.layers[0].mlp.gate_proj.weight.shape[0]
        self.gqa = self.nh != self.nkv
        self.norm_w, self.norm_eps = stack.norm.weight, stack.norm.eps
        self.pre, self.post, self.rms = fns
        self.kernels = kernels  # the kernels.triton_decode package, or None
        # RoPE angle pos * inv_freq: with one position stream (speech), multimodal RoPE is plain RoPE
        self.inv_freq = stack.rotary.inv_freq.float()

    def layer(self, i: int, x, cos, sin, attend):
        """One layer; `attend(i, q, k, v) -> attention output [B, heads, L, hd]` owns the cache."""
        p = self.layers[i]
        q, k, v = self.pre(x, p["w_ln"], p["w_qkv"], p["w_qn"], p["w_kn"], cos, sin, self.eps, self.nh, self.nkv,
                           self.hd)
        return self.post(x, attend(i, q, k, v), p["w_o"], p["w_ln2"], p["w_gu"], p["w_down"], self.eps, self.inter)

    def layer_rows(self, i: int, x, slot, pos, k_cache, v_cache, attend=None, one_per_slot: bool = False,
                   width: int = 0):
        """One layer over one position per row, `x` `[M, H]`, in six Triton launches (kernels/triton_decode/):
        row m's key/value goes to `[slot[m], :, pos[m]]` of this layer's cache `[slots, kv_heads, L, hd]`
        and it attends to positions `[0, pos[m]]` there (with `attend(q [M, heads, hd]) -> [M, heads * hd]`
        in place of `decode_attention` if given). No two rows share a slot (`one_per_slot`, or `width`: the
        positions lie below it): five launches, the cache write and the attention in one (`rope_attend`
        for short caches, `split_attend` over blocks of positions for long ones)."""
        p, dk = self.layers[i], self.kernels
        qkv = dk.linear(x, p["w_qkv"], norm=p["w_ln"], eps=self.eps)
        if width:
            a = dk.split_attend(qkv, p["w_qn"], p["w_kn"], self.inv_freq, k_cache, v_cache, slot, pos, self.nh,
                                self.eps, width)
        elif one_per_slot:
            a = dk.rope_attend(qkv, p["w_qn"], p["w_kn"], self.inv_freq, k_cache, v_cache, slot, pos, self.nh,
                               self.eps)
        else:
            q = dk.qk_norm_rope_store(qkv, p["w_qn"], p["w_kn"], self.inv_freq, k_cache, v_cache, slot, pos,
                                      self.nh, self.nkv, self.eps)
            a = attend(q) if attend is not None else dk.decode_attention(q, k_cache, v_cache, slot, pos)
        x = dk.linear(a, p["w_o"], residual=x)
        return dk.linear(dk.linear(x, p["w_gu"], norm=p["w_ln2"], eps=self.eps, swiglu=True), p["w_down"], residual=x)


def compiled_fns(enabled: bool):
    if not enabled:
        return _pre_attn, _post_attn, _rms
    import torch._dynamo

    # Variants: batch 1 vs symbolic batch, predictor first step (2 positions) vs later ones, 2-D/3-D norms.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    opts = dict(dynamic=True, fullgraph=True)
    return torch.compile(_pre_attn, **opts), torch.compile(_post_attn, **opts), torch.compile(_rms, **opts)


def decode_kernels(device: torch.device, use: bool | None, setting: str = "auto"):
    """The Triton decode-layer kernels (`kernels/triton_decode/`), or None (the compiled torch layer halves).
    `use` True: always (on the CPU under TRITON_INTERPRET=1, which is how CI tests them); False: never;
    None: `setting` (`Qwen3Settings.kernels`) "0" never, "1" always, "auto" on CUDA; either only with triton
    installed."""
    if use is None:
        use = (setting == "1" or (setting == "auto" and device.type == "cuda")) and find_spec("triton") is not None
    if not use:
        return None
    from streamvox.models.qwen3_tts.kernels import triton_decode

    return triton_decode

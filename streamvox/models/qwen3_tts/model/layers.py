"""Transformer pieces shared by the talker (`model/modules.py`) and the speech tokenizer
(`codec/code2wav.py`, `codec/encoder.py`).

Attribute names are the upstream checkpoints' (`q_proj`, `gate_proj`, `self_attn_layer_scale`, ...),
so a module built from these pieces keeps the state-dict keys its checkpoint uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "GatedMlp",
    "LayerScale",
    "LayerScaledBlock",
    "RMSNorm",
    "RotaryAttention",
    "activation",
    "apply_rope",
    "check_plain_rope",
    "rope_cos_sin",
    "rope_inv_freq",
]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function a config's `hidden_act` names (silu, gelu or relu)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}")
    return _ACTIVATIONS[name]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class GatedMlp(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


# --------------------------------------------------------------------------- rotary position embedding


def check_plain_rope(cfg: dict[str, Any], where: str) -> None:
    """Refuse RoPE variants this implementation does not do, rather than decode wrongly."""
    scaling = cfg.get("rope_scaling")
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind != "default" or float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: only plain RoPE is supported, got rope_scaling={scaling!r}")


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """Standard RoPE inverse frequencies (float32), `half`-rotation layout."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """cos/sin of shape [B, T, head_dim] for integer `positions` [B, T], computed in float32."""
    freqs = positions.float()[:, :, None] * inv_freq.to(positions.device)[None, None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by cos/sin [B, T, D]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


# --------------------------------------------------------------------------- attention and layer


class RotaryAttention(nn.Module):
    """Multi-head attention with RoPE on queries and keys: the projections and the attention math.

    Subclasses write `forward`, choosing which keys each query sees (a mask, or plain causal).
    """

    def __init__(self, hidden_size: int, n_heads: int, n_kv: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv = n_kv
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, n_kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, n_kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size, bias=bias)

    def rotated_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> q, k, v [B, heads, T, head_dim], q and k rotated by cos/sin [B, T, head_dim]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Scaled dot-product attention (key/value heads repeated for grouped queries), then `o_proj`."""
        b, _, t, _ = q.shape
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.head_dim**-0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class LayerScaledBlock(nn.Module):
    """Pre-norm transformer layer whose attention and MLP outputs are scaled per channel before each
    residual add (Mimi's layout). Arguments after `x` are passed on to the attention."""

    def __init__(
        self,
        attn: nn.Module,
        mlp: nn.Module,
        norm: Callable[[], nn.Module],
        hidden_size: int,
        scale_init: float,
    ) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.self_attn_layer_scale = LayerScale(hidden_size, scale_init)
        self.mlp_layer_scale = LayerScale(hidden_size, scale_init)

    def forward(self, x: torch.Tensor, *attn_args: Any) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), *attn_args))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))

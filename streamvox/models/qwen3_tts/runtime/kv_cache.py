"""The talker's key/value cache: one preallocated slot per running request, and the views through which
the talker's layers (`model/modules.py`, `cache.update(layer, k, v)`) write and read it."""

from __future__ import annotations

import torch


class SlotCache:
    """Preallocated keys/values `[layers, slots, kv_heads, max_len, head_dim]`."""

    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len


class PrefillView:
    """One request's prompt written into its slot at positions 0..L-1."""

    def __init__(self, cache: SlotCache, slot: int) -> None:
        self.cache, self.slot = cache, slot

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[2]
        self.cache.k[layer, self.slot, :, :n] = k[0]
        self.cache.v[layer, self.slot, :, :n] = v[0]
        return k, v


class DecodeView:
    """One new position per row, each row in its own slot at its own length."""

    def __init__(self, cache: SlotCache, slots: torch.Tensor, pos: torch.Tensor) -> None:
        self.cache, self.slots, self.pos = cache, slots, pos
        self.width = int(pos.max()) + 1

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.k[layer, self.slots, :, self.pos] = k[:, :, 0]
        self.cache.v[layer, self.slots, :, self.pos] = v[:, :, 0]
        w = self.width
        return self.cache.k[layer, self.slots, :, :w], self.cache.v[layer, self.slots, :, :w]

    def mask(self) -> torch.Tensor:
        ar = torch.arange(self.width, device=self.pos.device)
        return (ar[None, :] <= self.pos[:, None])[:, None, None, :]

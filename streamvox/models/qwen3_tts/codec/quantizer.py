"""The codec decoder's split residual vector quantiser: 16-codebook frames to latent vectors (dequantisation
only; the module tree mirrors the checkpoint's `decoder.quantizer.*` keys)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from streamvox.models.qwen3_tts.codec.config import Code2WavConfig


class EuclideanCodebook(nn.Module):
    def __init__(self, dim: int, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.eps = eps

    def table(self) -> torch.Tensor:
        """The codewords; cached, and recomputed only when a weight changes (dtype/device moves too)."""
        key = (
            self.embedding_sum.data_ptr(),
            self.embedding_sum._version,
            self.cluster_usage.data_ptr(),
            self.cluster_usage._version,
        )
        if getattr(self, "_table_key", None) != key:
            self._table = self.embedding_sum / self.cluster_usage.clamp(min=self.eps)[:, None]
            self._table_key = key
        return self._table


class VectorQuantization(nn.Module):
    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, size)


class ResidualVQ(nn.Module):
    def __init__(self, n_q: int, dim: int, size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VectorQuantization(dim, size) for _ in range(n_q)])


class ResidualVectorQuantizer(nn.Module):
    """One RVQ group: codebooks in a `dim` space, 1x1 projections to/from `io_dim`.

    `input_proj` only serves encoding; it is kept so the checkpoint loads strictly.
    """

    def __init__(self, n_q: int, dim: int, io_dim: int, size: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = ResidualVQ(n_q, dim, size)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n, T] -> [B, io_dim, T]."""
        acc = None
        for i in range(codes.shape[1]):
            layer: VectorQuantization = self.vq.layers[i]  # type: ignore[assignment]
            e = F.embedding(codes[:, i], layer._codebook.table())
            acc = e if acc is None else acc + e
        assert acc is not None
        return self.output_proj(acc.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualVectorQuantizer(1, dim, cfg.codebook_dim, cfg.codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(
            cfg.num_quantizers - 1, dim, cfg.codebook_dim, cfg.codebook_size
        )

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.dequantize(codes[:, :1]) + self.rvq_rest.dequantize(codes[:, 1:])

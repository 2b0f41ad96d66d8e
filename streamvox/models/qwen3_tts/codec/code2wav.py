"""Qwen3-TTS-12Hz speech tokenizer decoder ("code2wav"), in plain torch.

Turns 16-codebook codec frames (12.5 Hz) into 24 kHz audio, 1920 samples per
frame. The module tree mirrors the upstream `speech_tokenizer/` checkpoint so
its `model.safetensors` loads as is (keys under `decoder.`).

Pipeline: split RVQ dequantisation (1 semantic + 15 acoustic codebooks) ->
causal conv -> sliding-window causal transformer -> 2 x (transposed conv +
ConvNeXt) -> conv -> 4 SnakeBeta upsampling blocks -> conv -> clamp.

Every layer is causal, so streaming is exact: each stateful layer keeps, per
request, the few past inputs it still needs (conv tails, the previous frames of
a transposed conv, the last `sliding_window - 1` keys/values of each attention
layer). `decode_stream` decodes every new frame exactly once; its output,
concatenated, equals `decode` of the whole sequence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from streamvox.models.qwen3_tts.model.layers import (
    GatedMlp,
    LayerScaledBlock,
    RMSNorm,
    RotaryAttention,
    activation,
    check_plain_rope,
    rope_cos_sin,
    rope_inv_freq,
)

__all__ = [
    "Code2Wav",
    "Code2WavConfig",
    "StreamState",
    "assign_weights",
    "load_speech_tokenizer_state",
    "resolve_speech_tokenizer_dir",
]


# --------------------------------------------------------------------------- config


@dataclass
class Code2WavConfig:
    """The `decoder_config` of a speech tokenizer `config.json` plus the top-level rates."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, top: dict[str, Any]) -> Code2WavConfig:
        """Build from a whole speech tokenizer config (or a bare `decoder_config` dict)."""
        dec = dict(top.get("decoder_config", top))
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: v for k, v in dec.items() if k in known}
        for k in ("upsample_rates", "upsampling_ratios"):
            if k in kwargs:
                kwargs[k] = tuple(int(x) for x in kwargs[k])
        if "output_sample_rate" in top:
            kwargs["output_sample_rate"] = int(top["output_sample_rate"])
        if "decode_upsample_rate" in top:
            kwargs["decode_upsample_rate"] = int(top["decode_upsample_rate"])
        extra = {k: v for k, v in dec.items() if k not in known}
        check_plain_rope(extra, "decoder_config")
        return cls(**kwargs, extra=extra)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def total_upsample(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)


# --------------------------------------------------------------------------- streaming plumbing


class StreamState:
    """One request's decoder state: frames decoded so far and each layer's carried tail.

    Tensors have no batch dimension. Drop the object to free it.
    """

    __slots__ = ("frames", "_tails", "_batch")

    def __init__(self) -> None:
        self.frames = 0
        self._tails: dict[str, torch.Tensor] | None = {}
        # (batched tails of the last call, this request's row, rows in that call): lets the next call
        # reuse the batched tensors as they are when it decodes the same requests in the same order.
        self._batch: tuple[dict[str, torch.Tensor], int, int] | None = None

    @property
    def tails(self) -> dict[str, torch.Tensor]:
        if self._tails is None:
            assert self._batch is not None
            batched, row, _ = self._batch
            self._tails = {name: t[row] for name, t in batched.items()}
        return self._tails

    def set_batch(self, batched: dict[str, torch.Tensor], row: int, rows: int) -> None:
        self._batch = (batched, row, rows)
        self._tails = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tails.values())


class DecodeStep:
    """What one batched forward needs: carried tails in, new tails out, per-row lengths.

    `frames[b]` is row b's number of real (unpadded) frames in this call; `rows_full`
    says every row is full length (no padding), the common equal-chunk case.
    `tails_in[name]` is a batched tail or None (fresh rows: zeros are implied).
    """

    def __init__(
        self,
        frames: torch.Tensor,
        rows_full: bool,
        start: torch.Tensor,
        tails_in: dict[str, torch.Tensor | None],
        keep_state: bool,
    ) -> None:
        self.frames = frames
        self.rows_full = rows_full
        self.start = start  # absolute frame index of each row's first input frame
        self.tails_in = tails_in
        self.tails_out: dict[str, torch.Tensor] = {}
        self.keep_state = keep_state

    def take_tail(self, x: torch.Tensor, dim: int, valid: torch.Tensor | int, n: int) -> torch.Tensor:
        """The `n` positions of `x` along `dim` just before each row's `valid` end."""
        if self.rows_full or isinstance(valid, int):
            end = x.shape[dim] if isinstance(valid, torch.Tensor) else valid
            return x.narrow(dim, end - n, n).contiguous()
        idx = valid[:, None] - n + torch.arange(n, device=x.device)[None, :]  # [B, n]
        shape = [x.shape[0]] + [1] * (x.dim() - 1)
        shape[dim] = n
        idx = idx.view(shape).expand(*[x.shape[i] if i != dim else n for i in range(x.dim())])
        return torch.gather(x, dim, idx)


class _Stateful(nn.Module):
    """A layer that carries a tail between calls; `rate` is its time resolution in steps per frame."""

    tail_name: str = ""
    rate: int = 1

    def _prepend_tail(self, x: torch.Tensor, step: DecodeStep, n: int) -> torch.Tensor:
        """x [B, C, T] behind the last `n` input steps of the previous call (zeros for a fresh
        stream); records this call's last `n` for the next one."""
        tail = step.tails_in.get(self.tail_name)
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], n)
        xc = torch.cat([tail, x], dim=-1)
        if step.keep_state:
            step.tails_out[self.tail_name] = step.take_tail(xc, 2, step.frames * self.rate + n, n)
        return xc


# --------------------------------------------------------------------------- layers


class CausalConv1d(_Stateful):
    """Left-padded (causal) stride-1 conv; streaming keeps the last `(k - 1) * dilation` inputs."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        if self.context == 0:
            return self.conv(x)
        return self.conv(self._prepend_tail(x, step, self.context))


class CausalConvTranspose1d(_Stateful):
    """Transposed conv trimmed on the right so output `t` only sees inputs `<= t // stride`.

    Streaming prepends the previous `ceil((k - s) / s)` input steps and keeps only
    the outputs that belong to the new ones (zero tails reproduce the offline start).
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride = stride
        self.context = -(-(kernel - stride) // stride)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        t = x.shape[-1]
        if self.context == 0:
            return self.conv(x)[..., : t * self.stride]
        y = self.conv(self._prepend_tail(x, step, self.context))
        off = self.context * self.stride
        return y[..., off : off + t * self.stride]


def _snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    a = alpha.exp()[None, :, None]
    b = beta.exp()[None, :, None]
    return x + torch.sin(x * a).pow(2) / (b + 1e-9)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (log-scale parameters).

    `fn` is `_snake`, or its torch.compile'd form on CUDA (`Code2Wav.compile_pointwise`): one fused
    kernel instead of six passes over the activations, which at the late, high-rate blocks are the
    largest tensors of the decoder. Only large inputs (many rows or frames) take the fused form."""

    fn = staticmethod(_snake)
    FUSE_MIN_ELEMENTS = 1 << 22  # smaller inputs run eagerly: there the compiled call's host overhead dominates

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < self.FUSE_MIN_ELEMENTS:
            return _snake(x, self.alpha, self.beta)
        return self.fn(x, self.alpha, self.beta)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        h = self.dwconv(x, step).transpose(1, 2)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        h = self.conv1(self.act1(x), step)
        return x + self.conv2(self.act2(h), step)


class DecoderBlock(nn.Module):
    """SnakeBeta, upsampling transposed conv (kernel 2r, stride r), three dilated residual units."""

    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalConvTranspose1d(c_in, c_out, 2 * rate, rate)]
            + [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        x = self.block[0](x)
        for layer in self.block[1:]:
            x = layer(x, step)
        return x


class Attention(RotaryAttention, _Stateful):
    """Causal self-attention over the last `window` positions (the query's own included)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim, cfg.attention_bias
        )
        self.window = cfg.sliding_window

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, step: DecodeStep
    ) -> torch.Tensor:
        q, k, v = self.rotated_qkv(x, cos, sin)
        ctx = self.window - 1
        if ctx > 0:
            kv = step.tails_in.get(self.tail_name)
            if kv is None:
                kv = k.new_zeros(x.shape[0], 2, self.n_kv, ctx, self.head_dim)
            k = torch.cat([kv[:, 0], k], dim=2)
            v = torch.cat([kv[:, 1], v], dim=2)
            if step.keep_state:
                # tail: the last ctx rotated keys and values, [B, 2, H, ctx, D]
                kv_all = torch.stack([k, v], dim=1)
                step.tails_out[self.tail_name] = step.take_tail(kv_all, 3, step.frames + ctx, ctx)
        return self.attend(q, k, v, mask=mask)


def _transformer_layer(cfg: Code2WavConfig) -> LayerScaledBlock:
    return LayerScaledBlock(
        Attention(cfg),
        GatedMlp(cfg.hidden_size, cfg.intermediate_size, activation(cfg.hidden_act)),
        lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        cfg.hidden_size,
        cfg.layer_scale_initial_scale,
    )


class Transformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_transformer_layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.window = cfg.sliding_window
        self.register_buffer("inv_freq", rope_inv_freq(cfg.attn_head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        """x: [B, T, latent] -> [B, T, latent]."""
        b, t, _ = x.shape
        h = self.input_proj(x)
        rel = torch.arange(t, device=x.device)
        positions = step.start[:, None] + rel[None, :]
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        ctx = self.window - 1
        # keys are [carried ctx | this chunk]; key j sits at offset j - ctx from the chunk start
        k_rel = torch.arange(-ctx, t, device=x.device)
        diff = rel[:, None] - k_rel[None, :]  # query offset - key offset
        allowed = (diff >= 0) & (diff < self.window)
        allowed = allowed[None] & (
            k_rel[None, None, :] >= -step.start[:, None, None]
        )  # no key before frame 0
        mask = allowed[:, None]  # [B, 1, T, ctx + T]
        for layer in self.layers:
            h = layer(h, cos, sin, mask, step)
        return self.output_proj(self.norm(h))


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


class Decoder(nn.Module):
    """Mirrors upstream `decoder.*` keys."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r),
                        ConvNeXtBlock(cfg.latent_dim),
                    ]
                )
                for r in cfg.upsampling_ratios
            ]
        )
        n_blocks = len(cfg.upsample_rates)
        blocks: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, r in enumerate(cfg.upsample_rates):
            blocks.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), r))
        out_dim = cfg.decoder_dim // 2**n_blocks
        blocks += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        self._assign_rates()

    def _assign_rates(self) -> None:
        """Name each stateful layer and record its time resolution (steps per codec frame)."""
        rate = 1
        self.pre_conv.rate = 1
        for layer in self.pre_transformer.layers:
            layer.self_attn.rate = 1  # type: ignore[union-attr]
        for up in self.upsample:
            up[0].rate = rate  # type: ignore[index]
            rate *= up[0].stride  # type: ignore[index]
            up[1].dwconv.rate = rate  # type: ignore[index]
        self.decoder[0].rate = rate
        for blk in self.decoder[1:-2]:
            tconv = blk.block[1]
            tconv.rate = rate
            rate *= tconv.stride
            for unit in blk.block[2:]:
                unit.conv1.rate = rate
                unit.conv2.rate = rate
        self.decoder[-1].rate = rate
        for name, mod in self.named_modules():
            if isinstance(mod, _Stateful):
                mod.tail_name = name

    def forward(self, codes: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        """codes [B, Q, T] -> waveform [B, T * total_upsample] in [-1, 1]."""
        h = self.quantizer.dequantize(codes)
        h = self.pre_conv(h, step)
        h = self.pre_transformer(h.transpose(1, 2), step).transpose(1, 2)
        for up in self.upsample:
            h = up[0](h, step)  # type: ignore[index]
            h = up[1](h, step)  # type: ignore[index]
        h = self.decoder[0](h, step)
        for blk in self.decoder[1:-2]:
            h = blk(h, step)
        h = self.decoder[-2](h)
        h = self.decoder[-1](h, step)
        return h.squeeze(1).clamp(-1.0, 1.0)


# --------------------------------------------------------------------------- public model


def resolve_speech_tokenizer_dir(path: str | Path) -> Path:
    """Accept either the `speech_tokenizer/` dir itself or a full Qwen3-TTS model dir holding one."""
    path = Path(path)
    if not (path / "config.json").exists() and (path / "speech_tokenizer" / "config.json").exists():
        return path / "speech_tokenizer"
    if (path / "speech_tokenizer" / "config.json").exists():
        top = json.loads((path / "config.json").read_text())
        if "decoder_config" not in top:
            return path / "speech_tokenizer"
    return path


def load_speech_tokenizer_state(path: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors under `prefix` from a speech tokenizer dir's safetensors files, prefix stripped."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if k.startswith(prefix):
                out[k[len(prefix) :]] = v
    return out


def assign_weights(module: nn.Module, state: dict[str, torch.Tensor], half: str) -> None:
    """Give a `module` built on the meta device the tensors of `state`; a missing or unexpected key is an error."""
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"speech tokenizer {half} weights mismatch: missing={missing} unexpected={unexpected}")


class Code2Wav(nn.Module):
    """Codes -> 24 kHz waveform, offline (`decode`) or as exact per-request streams (`decode_stream`)."""

    # The range check costs a host sync; a caller whose codes come from the model's own heads
    # (always < codebook_size) may turn it off.
    check_codes: bool = True

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = Decoder(cfg)
        if cfg.total_upsample != cfg.decode_upsample_rate:
            raise ValueError(
                f"decoder upsamples by {cfg.total_upsample}, "
                f"config says decode_upsample_rate={cfg.decode_upsample_rate}"
            )

    @property
    def sample_rate(self) -> int:
        return self.cfg.output_sample_rate

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.total_upsample

    @property
    def num_quantizers(self) -> int:
        return self.cfg.num_quantizers

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        compile_snake: bool = True,
    ) -> Code2Wav:
        """Load from a `speech_tokenizer/` dir (config.json + safetensors); `encoder.*` keys are ignored.
        On CUDA with `compile_snake` (`Qwen3Settings.codec_compile`) the SnakeBeta activations are fused."""
        path = resolve_speech_tokenizer_dir(path)
        cfg = Code2WavConfig.from_dict(json.loads((path / "config.json").read_text()))
        with torch.device("meta"):
            model = cls(cfg)
        assign_weights(model.decoder, load_speech_tokenizer_state(path, "decoder."), "decoder")
        model.decoder.pre_transformer.inv_freq = rope_inv_freq(cfg.attn_head_dim, cfg.rope_theta)
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if torch.device(device).type == "cuda" and compile_snake:
            model.compile_pointwise()
        return model

    def compile_pointwise(self) -> None:
        """Fuse the SnakeBeta activations with torch.compile (dynamic shapes; CUDA)."""
        import torch._dynamo

        # one variant per block's channel count and input layout: more than dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        fused = torch.compile(_snake, dynamic=True, fullgraph=True)
        for mod in self.modules():
            if isinstance(mod, SnakeBeta):
                mod.fn = fused

    def _check_codes(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")

    def _safe_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Negative codes (upstream's padding) decode as 0, like upstream; codes past the codebook
        raise here, before an out-of-range lookup could kill a CUDA context."""
        if self.check_codes and bool((codes >= self.cfg.codebook_size).any()):
            raise ValueError(f"codes must be < codebook_size ({self.cfg.codebook_size})")
        return codes.clamp(min=0)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Offline decode: codes LongTensor [B, 16, T] -> float waveform [B, T * 1920].

        Exact full-sequence decode. (Upstream's `decode` cuts sequences over 300 frames into
        300-frame pieces with 25 frames of left context, an approximation past 300 frames.)
        """
        self._check_codes(codes)
        b, _, t = codes.shape
        dev = self.decoder.pre_conv.conv.weight.device
        step = DecodeStep(
            frames=torch.full((b,), t, dtype=torch.long, device=dev),
            rows_full=True,
            start=torch.zeros(b, dtype=torch.long, device=dev),
            tails_in={},
            keep_state=False,
        )
        return self.decoder(self._safe_codes(codes.to(dev)), step)

    def new_stream_state(self) -> StreamState:
        """Fresh per-request streaming state (nothing decoded yet)."""
        return StreamState()

    def release_stream(self, state: StreamState) -> None:
        """Nothing to do: a `StreamState` holds its own tails and is freed with the request."""

    @torch.inference_mode()
    def decode_stream(self, codes_list: list[torch.Tensor], states: list[StreamState]) -> list[torch.Tensor]:
        """Decode the next chunk of several requests in one batched forward.

        codes_list[i]: LongTensor [16, t_i] (t_i >= 0), the request's next frames;
        states[i]: that request's `StreamState`, updated in place. Returns the new
        samples of each request, FloatTensor [t_i * 1920]. Uneven chunks are right-padded
        (padding never reaches real outputs: every layer is causal).
        """
        if len(codes_list) != len(states):
            raise ValueError("codes_list and states differ in length")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("the same StreamState appears twice in one call")
        dev = self.decoder.pre_conv.conv.weight.device
        q = self.cfg.num_quantizers
        spf = self.samples_per_frame
        outs: list[torch.Tensor | None] = [None] * len(states)
        rows = []
        for i, c in enumerate(codes_list):
            if c.dim() != 2 or c.shape[0] != q:
                raise ValueError(f"codes_list[{i}] must be [{q}, t], got {tuple(c.shape)}")
            if c.shape[1] == 0:
                outs[i] = torch.zeros(0, device=dev, dtype=self.decoder.pre_conv.conv.weight.dtype)
            else:
                rows.append(i)
        if rows:
            lens = [codes_list[i].shape[1] for i in rows]
            t_max = max(lens)
            if all(n == t_max for n in lens):
                codes = torch.stack([codes_list[i] for i in rows]).to(dev, torch.long)
            else:
                codes = torch.zeros(len(rows), q, t_max, dtype=torch.long, device=dev)
                for r, i in enumerate(rows):
                    codes[r, :, : lens[r]] = codes_list[i].to(dev)
            row_states = [states[i] for i in rows]
            tails_in: dict[str, torch.Tensor | None] = {}
            first = row_states[0]._batch
            same = (
                first is not None
                and first[2] == len(row_states)
                and all(s._batch is not None and s._batch[0] is first[0] and s._batch[1] == r
                        for r, s in enumerate(row_states))
            )
            for name, mod in self.decoder.named_modules():
                if same:
                    assert first is not None
                    if name in first[0]:
                        tails_in[name] = first[0][name]
                    continue
                if not isinstance(mod, _Stateful) or not mod.tail_name:
                    continue
                have = [s.tails.get(name) for s in row_states]
                if all(h is None for h in have):
                    tails_in[name] = None
                    continue
                like = next(h for h in have if h is not None)
                tails_in[name] = torch.stack([h if h is not None else torch.zeros_like(like) for h in have])
            meta = torch.tensor(lens + [s.frames for s in row_states], dtype=torch.long)
            if dev.type == "cuda":  # a pinned, non-blocking copy: no host sync
                meta = meta.pin_memory()
            meta = meta.to(dev, non_blocking=True)
            step = DecodeStep(
                frames=meta[: len(rows)],
                rows_full=all(n == t_max for n in lens),
                start=meta[len(rows) :],
                tails_in=tails_in,
                keep_state=True,
            )
            wav = self.decoder(self._safe_codes(codes), step)
            for r, i in enumerate(rows):
                st = states[i]
                st.frames += lens[r]
                st.set_batch(step.tails_out, r, len(rows))
                outs[i] = wav[r, : lens[r] * spf]
        return [o for o in outs if o is not None]


@torch.inference_mode()
def agreement_db(reference: Code2Wav, other: Code2Wav, rows: int = 2, frames: int = 50) -> float:
    """How closely `other` (the same weights in another dtype) decodes as `reference`: the signal-to-error
    ratio in dB of its waveforms for `rows` x `frames` seeded random codes, -inf if any sample is not
    finite (an overflow). Random codes draw on the same codebook vectors as speech, so they exercise the
    checkpoint's own activation ranges."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, reference.cfg.codebook_size, (rows, reference.num_quantizers, frames), generator=g)
    want = reference.decode(codes).float()
    got = other.decode(codes).float()
    if not bool(torch.isfinite(got).all()):
        return float("-inf")
    err = float((got - want).norm() / want.norm())
    return math.inf if err == 0 else -20 * math.log10(err)

"""Qwen3-TTS-12Hz speech tokenizer decoder ("code2wav"), in plain torch.

Turns 16-codebook codec frames (12.5 Hz) into 24 kHz audio, 1920 samples per
frame. The module tree mirrors the upstream `speech_tokenizer/` checkpoint so
its `model.safetensors` loads as is (keys under `decoder.`).

Pipeline: split RVQ dequantisation (1 semantic + 15 acoustic codebooks) ->
causal conv -> sliding-window causal transformer -> 2 x (transposed conv +
ConvNeXt) -> conv -> 4 SnakeBeta upsampling blocks -> conv -> clamp.

Every layer is causal, so streaming is exact: each stateful layer keeps, per
request, the few past inputs it still needs (`decoder_layers.py`). `decode_stream`
decodes every new frame exactly once; its output, concatenated, equals `decode`
of the whole sequence. The quantiser is in `quantizer.py`, the configuration in
`config.py`, the checkpoint's files are read by `weights.py`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from streamvox.models.qwen3_tts.codec.config import Code2WavConfig
from streamvox.models.qwen3_tts.codec.decoder_layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    DecoderBlock,
    DecodeStep,
    SnakeBeta,
    Stateful,
    Transformer,
    snake,
)
from streamvox.models.qwen3_tts.codec.quantizer import SplitRVQ
from streamvox.models.qwen3_tts.codec.weights import (
    assign_weights,
    load_speech_tokenizer_state,
    resolve_speech_tokenizer_dir,
)
from streamvox.models.qwen3_tts.model.layers import rope_inv_freq

__all__ = ["Code2Wav", "StreamState", "agreement_db"]


# --------------------------------------------------------------------------- streaming state


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
            if isinstance(mod, Stateful):
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
        fused = torch.compile(snake, dynamic=True, fullgraph=True)
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
                if not isinstance(mod, Stateful) or not mod.tail_name:
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

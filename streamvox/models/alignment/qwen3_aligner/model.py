"""The forced aligner as a torch module: audio tower, Qwen3 text body, and the timing-class head.

One non-autoregressive pass: the prompt's embeddings, with the audio tower's output in place of its
`<|audio_pad|>` tokens, go through the causal Qwen3 decoder (StreamVox's Qwen3 layers, the talker's),
and the head gives `classify_num` logits at the `<timestamp>` tokens: the timings. Rows of a batch
are right-padded: under the causal mask a row's real tokens never see its padding, and each row
counts positions from 0, so a row's logits do not depend on the rows beside it.
Module names are the checkpoint's (`thinker.audio_tower`, `thinker.model.layers.0`, `thinker.lm_head`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from streamvox.models.alignment.qwen3_aligner.audio_encoder import AudioEncoder
from streamvox.models.alignment.qwen3_aligner.config import AlignerConfig
from streamvox.models.qwen3_tts.config import DecoderConfig
from streamvox.models.qwen3_tts.model.layers import RMSNorm
from streamvox.models.qwen3_tts.model.modules import DecoderLayer, DecoderStack, Rope
from streamvox.models.qwen3_tts.runtime.fused_stack import FusedStack, compiled_fns


class _NoCache:
    """One pass over the whole prompt: each layer attends to the keys and values it just made."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v


class TextModel(DecoderStack):
    """The Qwen3 text body. `fuse` switches it to the fast path's fused layers (`FusedStack`: q/k/v and gate/up
    concatenated, layer halves compiled on CUDA, flash attention), the same arithmetic in about a tenth of the
    launches."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rope(cfg)
        self.fused: FusedStack | None = None

    def fuse(self, compiled: bool) -> None:
        """Run the layers as a `FusedStack` from now on, its layer halves `torch.compile`d if `compiled`."""
        self.fused = FusedStack(self, compiled_fns(compiled))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `[B, T, hidden]` embeddings -> final-normed hidden states, causal, positions 0..T-1 in every row."""
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device).expand(b, t)
        stack = self.fused
        if stack is None:
            return self.run(x, positions, _NoCache())
        cos, sin = self.rotary(positions[:1], x.dtype)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=stack.gqa)

        for i in range(len(stack.layers)):
            x = stack.layer(i, x, cos, sin, attend)
        return stack.rms(x, stack.norm_w, stack.norm_eps)


class Thinker(nn.Module):
    def __init__(self, cfg: AlignerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.audio_tower = AudioEncoder(cfg.audio)
        self.model = TextModel(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.classify_num, bias=False)

    def forward(
        self, ids: torch.Tensor, features: torch.Tensor, frames: list[int], markers: torch.Tensor
    ) -> torch.Tensor:
        """ids `[B, T]` (right-padded prompts, one `<|audio_pad|>` per audio position of their clip),
        features `[B, n_mels, F]` with each clip's valid frames, markers `[B, T]` (where the prompts'
        `<timestamp>` tokens are) -> logits at the markers `[markers, classify_num]`, row after row."""
        x = self.model.embed_tokens(ids)
        audio = torch.cat(self.audio_tower(features.to(x.dtype), frames)).to(x.dtype)
        x = x.masked_scatter((ids == self.cfg.audio_token_id)[..., None], audio)
        return self.lm_head(self.model(x)[markers])

    def forward_padded(self, ids: torch.Tensor, features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """`forward` with shapes fixed by the padding (see `AudioEncoder.forward_padded`): ids `[B, T]` (each
        row's audio pads right after its first token), features `[B, n_mels, C * chunk]`, valid frames `[B]`
        -> logits at every position `[B, T, classify_num]`."""
        x = self.model.embed_tokens(ids)
        audio, _ = self.audio_tower.forward_padded(features.to(x.dtype), frames)
        index = (torch.arange(ids.shape[1], device=ids.device) - 1).clamp(0, audio.shape[1] - 1)
        x = torch.where((ids == self.cfg.audio_token_id)[..., None], audio[:, index].to(x.dtype), x)
        return self.lm_head(self.model(x))


class ForcedAligner(nn.Module):
    """The checkpoint's top level (its keys start with `thinker.`)."""

    def __init__(self, cfg: AlignerConfig) -> None:
        super().__init__()
        self.thinker = Thinker(cfg)

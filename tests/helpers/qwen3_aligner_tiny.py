"""Tiny random-weight Qwen3-ForcedAligner checkpoints in the released directory layout.

`build_tiny_aligner(path, seed)` writes config.json (a Qwen3-ASR config whose thinker is a forced
aligner), preprocessor_config.json (Whisper features), model.safetensors (the checkpoint's key names),
and a small byte-level BPE tokenizer (vocab.json, merges.txt, tokenizer_config.json) holding the audio
special tokens and `<timestamp>` that the aligner's prompt uses. Both our loader and the reference
`qwen-asr` package load the same directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from streamvox.models.alignment.qwen3_aligner.config import load_aligner_config
from streamvox.models.alignment.qwen3_aligner.model import ForcedAligner
from streamvox.models.qwen3_tts.text import qwen2_pipeline

CORPUS = [
    "Hello world, this is a tiny test of streaming speech.",
    "The quick brown fox jumps over the lazy dog again and again.",
    "Captions need word timings, 42 of them, and barge-in needs the words heard.",
    "Numbers like 12 and 345 and punctuation! Does it work? Yes: it does.",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
            "<timestamp>"]
RATE = 16000  # the aligner's feature rate
CLASSES = 5000  # the released head's timing classes (80 ms each)
TOKENIZER_EXTRAS = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                    "audio_eos_token": "<|audio_end|>"}


def _tokenizer(out: Path) -> dict[str, int]:
    tok = qwen2_pipeline(Tokenizer(models.BPE(unk_token=None)))
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.model.save(str(out))  # vocab.json, merges.txt
    base = tok.get_vocab_size()
    ids = {name: base + i for i, name in enumerate(SPECIALS)}
    added = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for name, i in ids.items()}
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072, "errors": "replace", "bos_token": None,
           "unk_token": None, "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
           "clean_up_tokenization_spaces": False, "split_special_tokens": False, "added_tokens_decoder": added,
           "extra_special_tokens": TOKENIZER_EXTRAS}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return ids


def tiny_config(ids: dict[str, int], vocab: int, audio_layers: int = 2, text_layers: int = 2) -> dict:
    audio = dict(num_mel_bins=128, encoder_layers=audio_layers, encoder_attention_heads=4, encoder_ffn_dim=64,
                 d_model=32, dropout=0.0, attention_dropout=0.0, activation_function="gelu",
                 activation_dropout=0.0, scale_embedding=False, max_source_positions=1500, n_window=50,
                 output_dim=48, n_window_infer=800, conv_chunksize=500, downsample_hidden_size=8)
    text = dict(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=text_layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=12, hidden_act="silu",
                max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
                attention_dropout=0.0, tie_word_embeddings=False,
                rope_scaling={"interleaved": True, "mrope_interleaved": True, "mrope_section": [2, 2, 2],
                              "rope_type": "default", "type": "default"})
    thinker = dict(model_type="qwen3_forced_aligner", audio_config=audio, text_config=text,
                   audio_token_id=ids["<|audio_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
                   audio_end_token_id=ids["<|audio_end|>"], classify_num=CLASSES, initializer_range=0.02)
    return {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
            "thinker_config": thinker, "support_languages": ["English", "Chinese"],
            "timestamp_token_id": ids["<timestamp>"], "timestamp_segment_time": 80, "torch_dtype": "float32"}


FEATURES = {"chunk_length": 30, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128, "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
            "padding_side": "right", "padding_value": 0.0, "processor_class": "Qwen3ASRProcessor",
            "return_attention_mask": True, "sampling_rate": 16000}


def build_tiny_aligner(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny random forced-aligner checkpoint to `path` (weights from `seed`) and return `path`."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(out)
    (out / "config.json").write_text(json.dumps(tiny_config(ids, max(ids.values()) + 1 + 10), indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps(FEATURES, indent=1))
    torch.manual_seed(seed)
    module = ForcedAligner(load_aligner_config(out))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() >= 2:
                fan_in = p[0].numel()
                p.normal_(0.0, (0.5 if "embed" in name else 1.5) / fan_in**0.5)
            else:
                p.normal_(0.0, 0.05)
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Bursts of a tone in noise at `RATE`: structure enough that random weights give varied timing classes."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * RATE)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * (180 + 40 * seed) * t) * (np.sin(2 * np.pi * 1.5 * t + seed) > 0)
    return (tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


ITEM_TEXTS = ["Hello world, this is a small test of the aligner.", "Captions need 42 timings!",
              "The quick brown fox jumps over the lazy dog, again and again and again and again.", "Quick, brown fox."]
# Seconds: under one chunk, off the hop, and past one 8 s attention window (a second window, cut short).
ITEM_SECONDS = [0.55, 2.0 + 77 / RATE, 10.3, 3.4]


def speechlike_items(count: int) -> list:
    """`count` (pcm, rate, words) items to align, of the lengths and texts above in turn."""
    return [(speechlike(ITEM_SECONDS[i % 4], i), RATE, ITEM_TEXTS[i % 4].split()) for i in range(count)]

"""Tiny random-weight Qwen3-TTS-12Hz checkpoints in the upstream directory layout.

`build_tiny_checkpoint(path, task)` writes config.json, generation_config.json,
model.safetensors (upstream key names), and a small byte-level BPE tokenizer as
vocab.json + merges.txt + tokenizer_config.json (loadable by both our `tokenizers`
pipeline and transformers' Qwen2 tokenizer). A `speech_tokenizer/` directory is
written by `speech_tokenizer_builder(dir)` when one is given (the codec side owns
that format).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, trainers

from streamvox.models.qwen3_tts.config import parse_config
from streamvox.models.qwen3_tts.model.modules import Qwen3TTS
from streamvox.models.qwen3_tts.text import qwen2_pipeline

CORPUS = [
    "Hello world, this is a tiny test of streaming speech.",
    "The quick brown fox jumps over the lazy dog again and again.",
    "Streaming text arrives word by word while audio is generated.",
    "Numbers like 12 and 345 and punctuation! Does it work? Yes: it does.",
    "Speak softly, with a warm and gentle voice, please.",
] + ["assistant user assistant user"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
# Like upstream, the talker's codec vocabulary is the codebook plus 1024 control ids, and the
# control range [codebook, codebook + 1024) is suppressed in sampling (except end-of-speech).
# Control ids below are offsets into that range.
SPEAKERS = {"alice": 40, "bob": 41, "dylan": 42}
LANGUAGES = {"english": 30, "chinese": 31, "beijing_dialect": 32}
CONTROL = dict(codec_pad_id=10, codec_bos_id=11, codec_eos_token_id=12, codec_think_id=13,
               codec_nothink_id=14, codec_think_bos_id=15, codec_think_eos_id=16)
CODEBOOK = 256


def _tokenizer(out: Path) -> dict[str, int]:
    tok = qwen2_pipeline(Tokenizer(models.BPE(unk_token=None)))
    from tokenizers import pre_tokenizers

    trainer = trainers.BpeTrainer(
        vocab_size=400, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.model.save(str(out))  # vocab.json, merges.txt
    base = tok.get_vocab_size()
    ids = {name: base + i for i, name in enumerate(SPECIALS)}
    added = {
        str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for name, i in ids.items()
    }
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768, "errors": "replace",
        "bos_token": None, "unk_token": None, "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": added,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return ids


def tiny_config(task: str, specials: dict[str, int], text_vocab: int, codebook_size: int = CODEBOOK,
                predictor_hidden: int = 24) -> dict:
    predictor = dict(
        vocab_size=codebook_size, hidden_size=predictor_hidden, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=12, rms_norm_eps=1e-6, rope_theta=10000,
        max_position_embeddings=64, num_code_groups=16, hidden_act="silu", use_sliding_window=False,
    )
    talker = dict(
        code_predictor_config=predictor,
        vocab_size=codebook_size + 1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default",
                      "type": "default"},
        max_position_embeddings=4096, num_code_groups=16, hidden_act="silu",
        text_vocab_size=text_vocab, text_hidden_size=40,
        **{k: codebook_size + v for k, v in CONTROL.items()},
        spk_id={k: codebook_size + v for k, v in SPEAKERS.items()} if task == "custom_voice" else {},
        spk_is_dialect=(
            {"alice": False, "bob": False, "dylan": "beijing_dialect"} if task == "custom_voice" else {}
        ),
        codec_language_id={k: codebook_size + v for k, v in LANGUAGES.items()},
        use_sliding_window=False,
    )
    speaker = dict(
        mel_dim=128, enc_dim=32, enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=8, enc_se_channels=16,
        sample_rate=24000,
    )
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "1b7",
        "tts_model_type": task,
        "im_start_token_id": specials["<|im_start|>"],
        "im_end_token_id": specials["<|im_end|>"],
        "tts_pad_token_id": specials["<tts_pad>"],
        "tts_bos_token_id": specials["<tts_text_bos>"],
        "tts_eos_token_id": specials["<tts_text_eod>"],
        "talker_config": talker,
        "speaker_encoder_config": speaker,
        "torch_dtype": "float32",
    }


def build_tiny_checkpoint(
    path: str | Path,
    task: str = "custom_voice",
    seed: int = 0,
    speech_tokenizer_builder: Callable[[Path], None] | None = None,
    codebook_size: int = CODEBOOK,
    predictor_hidden: int = 24,
) -> Path:
    """Write a tiny random checkpoint for `task` ("custom_voice" | "voice_design" | "base").

    `codebook_size` must match the speech tokenizer's when one is built alongside (the codes
    the talker emits index its codebooks). `predictor_hidden`: the code predictor's width; the talker's
    (32) gives the 0.6B model's layout, whose predictor takes the talker's hidden states without a
    projection (an identity), while 24 has a linear projection between them, as the 1.7B model."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    specials = _tokenizer(out)
    text_vocab = max(specials.values()) + 1 + 7
    cfg_dict = tiny_config(task, specials, text_vocab, codebook_size, predictor_hidden)
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9, "max_new_tokens": 64,
    }, indent=1))
    torch.manual_seed(seed)
    module = Qwen3TTS(parse_config(cfg_dict))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.startswith("talker") and p.dim() >= 2:
                p.normal_(0.0, 0.5 if "embedding" in name else 1.5 / p.shape[-1] ** 0.5)
            elif name.startswith("talker"):
                p.normal_(0.0, 0.1)
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if speech_tokenizer_builder is not None:
        speech_tokenizer_builder(out / "speech_tokenizer")
    return out

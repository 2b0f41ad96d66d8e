"""Tiny random-weight checkpoints of real architectures (Qwen3 LM, Whisper), built locally; nothing is downloaded.

The weights are random, so what the models say is gibberish: tests built on them check event flow, timing and
state, never meaning. The tokenizers are real byte-level BPE tokenizers trained (by the `tokenizers` library) on
a few sentences with punctuation, so random sampling often emits clause ends (", ", ". ") and a streaming talker
gets complete clauses while the thinker is still generating.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

_CORPUS = [
    "Hello, how are you today? I am fine, thank you. The weather is nice, and the sun is warm.",
    "Let me think about that. First, we go left; then, we go right. Finally, we stop here.",
    "Sure, I can help with that. What would you like to know? Tell me more, please.",
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine, they say.",
    "Yes. No. Maybe, but not today. Good morning, good evening, and good night.",
    "One, two, three, four, five. Red, green, blue. Cats, dogs, birds, and fish.",
]

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WHISPER_SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                   "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


# Words with their punctuation: the LM's tokenizer learns whole "word," / "word." tokens from these, so a clause
# end (punctuation, then a space) comes every few tokens even when the tokens are drawn at random.
_CLAUSE_WORDS = ("yes, no, maybe, sure, okay, right, well, hello, thanks, please, sorry, good, fine, great, "
                 "today, now, then, here, there, first, next, later, again, indeed, really, truly, quickly. "
                 "yes. no. maybe. sure. okay. right. well. hello. thanks. please. sorry. good. fine. great. "
                 "today. now. then. here. there. first. next. later. again. indeed. really. truly. quickly, ")


def _train_bpe(special: list[str], vocab_size: int, *, byte_level: bool = True) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    if byte_level:  # GPT-2 / Whisper style
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        corpus = _CORPUS * 4
    else:  # SentencePiece style: "▁word," pieces keep their punctuation
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
        tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never")
        alphabet = []
        corpus = [_CLAUSE_WORDS] * 8 + _CORPUS * 2
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=alphabet)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight") or name.endswith("layer_norm.weight") or name.endswith("_norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=generator) * 0.5).to(dtype)
    return tensors


def build_tiny_qwen3(directory: Path, *, seed: int = 0, vocab_size: int = 512) -> Path:
    """A 2-layer Qwen3ForCausalLM (head_dim 32, which the CPU attention kernel supports) in HF format."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_bpe(QWEN_SPECIAL, vocab_size - 16, byte_level=False)
    tokenizer.save(str(directory / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()  # every id the model can sample decodes to text
    eos = tokenizer.token_to_id("<|im_end|>")
    hidden, heads, kv_heads, head_dim, inter, layers = 64, 2, 1, 32, 128, 2
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "float32", "attention_bias": False,
        "bos_token_id": tokenizer.token_to_id("<|endoftext|>"), "eos_token_id": eos, "use_cache": True,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "additional_special_tokens": QWEN_SPECIAL,
    }))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, hidden),
                                          "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
    save_file(_random_tensors(shapes, seed, torch.float32), str(directory / "model.safetensors"))
    return directory


def build_tiny_whisper(directory: Path, *, seed: int = 0, vocab_size: int = 512) -> Path:
    """A 1+1-layer WhisperForConditionalGeneration (d_model 64, head_dim 32) with a real Whisper tokenizer layout."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_bpe(WHISPER_SPECIAL, vocab_size - 16)
    tokenizer.save(str(directory / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()
    vocab = tokenizer.get_vocab()
    plain = {tok: i for tok, i in vocab.items() if tok not in WHISPER_SPECIAL}
    (directory / "vocab.json").write_text(json.dumps(plain))
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    (directory / "added_tokens.json").write_text(json.dumps({t: vocab[t] for t in WHISPER_SPECIAL}))
    ids = {t: vocab[t] for t in WHISPER_SPECIAL}
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 1024,
        "additional_special_tokens": WHISPER_SPECIAL[1:], "clean_up_tokenization_spaces": False,
    }))
    (directory / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "additional_special_tokens": WHISPER_SPECIAL[1:]}))
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
        "feature_size": 80, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30, "n_fft": 400,
        "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": False}))
    d, heads, ffn, mel = 64, 2, 128, 80
    max_source, max_target = 1500, 448
    config = {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": vocab_size,
        "num_mel_bins": mel, "d_model": d, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": ffn,
        "decoder_ffn_dim": ffn, "activation_function": "gelu", "max_source_positions": max_source,
        "max_target_positions": max_target, "scale_embedding": False, "tie_word_embeddings": True,
        "torch_dtype": "float32", "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"], "decoder_start_token_id": ids["<|startoftranscript|>"],
        "begin_suppress_tokens": None, "suppress_tokens": [], "forced_decoder_ids": None,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({
        "decoder_start_token_id": ids["<|startoftranscript|>"], "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"], "no_timestamps_token_id": ids["<|notimestamps|>"],
        "lang_to_id": {"<|en|>": ids["<|en|>"]}, "task_to_id": {"transcribe": ids["<|transcribe|>"],
                                                                "translate": ids["<|translate|>"]},
        "is_multilingual": True, "max_length": max_target, "forced_decoder_ids": None}))

    def attention(prefix: str) -> dict:
        out = {}
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[f"{prefix}.{proj}.weight"] = (d, d)
            if proj != "k_proj":
                out[f"{prefix}.{proj}.bias"] = (d,)
        return out

    def block(prefix: str, cross: bool) -> dict:
        out = attention(prefix + ".self_attn")
        out.update({prefix + ".self_attn_layer_norm.weight": (d,), prefix + ".self_attn_layer_norm.bias": (d,),
                    prefix + ".fc1.weight": (ffn, d), prefix + ".fc1.bias": (ffn,),
                    prefix + ".fc2.weight": (d, ffn), prefix + ".fc2.bias": (d,),
                    prefix + ".final_layer_norm.weight": (d,), prefix + ".final_layer_norm.bias": (d,)})
        if cross:
            out.update(attention(prefix + ".encoder_attn"))
            out.update({prefix + ".encoder_attn_layer_norm.weight": (d,),
                        prefix + ".encoder_attn_layer_norm.bias": (d,)})
        return out

    shapes: dict[str, tuple[int, ...]] = {
        "model.encoder.conv1.weight": (d, mel, 3), "model.encoder.conv1.bias": (d,),
        "model.encoder.conv2.weight": (d, d, 3), "model.encoder.conv2.bias": (d,),
        "model.encoder.embed_positions.weight": (max_source, d),
        "model.encoder.layer_norm.weight": (d,), "model.encoder.layer_norm.bias": (d,),
        "model.decoder.embed_tokens.weight": (vocab_size, d),
        "model.decoder.embed_positions.weight": (max_target, d),
        "model.decoder.layer_norm.weight": (d,), "model.decoder.layer_norm.bias": (d,),
    }
    shapes.update(block("model.encoder.layers.0", cross=False))
    shapes.update(block("model.decoder.layers.0", cross=True))
    save_file(_random_tensors(shapes, seed + 1, torch.float32), str(directory / "model.safetensors"))
    return directory

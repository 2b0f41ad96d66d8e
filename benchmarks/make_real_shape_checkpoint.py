"""Write a random-weight Qwen3-TTS-12Hz CustomVoice checkpoint with the released shapes.

Timing does not depend on weight values, so this stands in for the released checkpoints on a machine
that cannot download them. Shapes (talker and code predictor from the released configs, speech
tokenizer decoder from the released `speech_tokenizer/config.json`):

  talker 0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 3072
  talker 1.7B: hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 6144
  both: codec vocab 3072 (2048 codes + 1024 control ids), text vocab 151936 (text hidden 2048),
        interleaved M-RoPE sections [24, 20, 20], rope theta 1e6
  code predictor: hidden 1024, 5 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 3072,
        vocab 2048, 16 code groups
  decoder: codebook 2048 x 16 quantizers, codebook_dim 512, latent 1024, transformer hidden 512,
        8 layers, 16 heads, head_dim 64, intermediate 1024, sliding window 72, decoder_dim 1536,
        upsample rates (8, 5, 4, 3) x upsampling ratios (2, 2) = 1920 samples per frame
The text tokenizer is the tests' tiny byte-level BPE (prompt lengths are a few dozen tokens, as with
the real one); the speech tokenizer's encoder is the tests' tiny one (only voice cloning uses it).

  python benchmarks/make_real_shape_checkpoint.py --size 1.7b --out /tmp/q3-1.7b --device cuda

`--aligner` writes a Qwen3-ForcedAligner-0.6B checkpoint instead (shapes from its released config.json):

  audio tower: 128 mel bins, d_model 1024, 24 layers, 16 heads, ffn 4096, conv channels 480, output 1024,
        chunks of 100 frames (n_window 50), attention windows of 800 frames (n_window_infer)
  text body: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 3072, vocab 152064,
        rope theta 1e6; head: 5000 timing classes of 80 ms
with the tests' tiny tokenizer (its own ids for the audio and `<timestamp>` tokens; words take a few
more tokens than with the real vocabulary, so prompts run a little long).

  python benchmarks/make_real_shape_checkpoint.py --aligner --out /tmp/fa-0.6b --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "helpers"))
from streamvox.models.alignment.qwen3_aligner.config import load_aligner_config  # noqa: E402
from streamvox.models.alignment.qwen3_aligner.model import ForcedAligner  # noqa: E402
from streamvox.models.qwen3_tts.config import parse_config  # noqa: E402
from streamvox.models.qwen3_tts.model.modules import Qwen3TTS  # noqa: E402
from tests.helpers.qwen3_aligner_tiny import FEATURES  # noqa: E402
from tests.helpers.qwen3_aligner_tiny import _tokenizer as aligner_tokenizer  # noqa: E402
from tests.helpers.qwen3_aligner_tiny import tiny_config as tiny_aligner_config  # noqa: E402
from tests.helpers.qwen3_tiny import _tokenizer, tiny_config  # noqa: E402
from tests.helpers.qwen3_tiny_codec import _decoder_shapes, _encoder_shapes, _random_tensor  # noqa: E402
from tests.helpers.qwen3_tiny_codec import tiny_config as tiny_codec_config  # noqa: E402

TALKER = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144),
}
RELEASED_DECODER = {
    "codebook_size": 2048, "codebook_dim": 512, "hidden_size": 512, "latent_dim": 1024,
    "intermediate_size": 1024, "head_dim": 64, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 8, "num_quantizers": 16, "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5,
    "rope_theta": 10000, "sliding_window": 72, "max_position_embeddings": 8000, "hidden_act": "silu",
    "attention_bias": False, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
}

RELEASED_ALIGNER_AUDIO = dict(num_mel_bins=128, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                              d_model=1024, max_source_positions=1500, n_window=50, output_dim=1024,
                              n_window_infer=800, downsample_hidden_size=480)
RELEASED_ALIGNER_TEXT = dict(vocab_size=152064, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                             num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
                             rms_norm_eps=1e-6, rope_scaling={"interleaved": True, "mrope_interleaved": True,
                                                              "mrope_section": [24, 20, 20], "rope_type": "default",
                                                              "type": "default"})


def _randomise(module: torch.nn.Module, device: str, seed: int) -> None:
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device=device))
            elif p.dim() >= 2:
                std = 0.5 if "embedding" in name else 1.5 / p.shape[-1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g, device=device) * std)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device) * 0.1)


def model_config(size: str, specials: dict[str, int], layers: int = 28) -> dict:
    cfg = tiny_config("custom_voice", specials, 151936, codebook_size=2048)
    t = cfg["talker_config"]
    t.update(num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             text_hidden_size=2048, max_position_embeddings=32768, rms_norm_eps=1e-6,
             rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                           "type": "default"},
             **TALKER[size])
    t["code_predictor_config"].update(
        vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=65536, rope_theta=1000000)
    cfg["tts_model_size"] = "0b6" if size == "0.6b" else "1b7"
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def build(size: str, out: Path, device: str, seed: int = 0, layers: int = 28) -> Path:
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    specials = _tokenizer(out)
    cfg = model_config(size, specials, layers)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9, "max_new_tokens": 8192,
    }, indent=1))
    torch.manual_seed(seed)
    with torch.device("meta"):
        module = Qwen3TTS(parse_config(cfg))
    module = module.to_empty(device=device).to(torch.bfloat16)
    _randomise(module, device, seed)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    n_params = sum(v.numel() for v in state.values())
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del module, state
    st = out / "speech_tokenizer"
    st.mkdir(exist_ok=True)
    ccfg = tiny_codec_config()
    ccfg["decoder_config"] = dict(RELEASED_DECODER)
    shapes = _decoder_shapes(ccfg)
    shapes.update(_encoder_shapes(ccfg))
    cg = torch.Generator().manual_seed(seed)
    tensors = {name: _random_tensor(name, shape, cg, tr).contiguous() for name, (shape, tr) in sorted(shapes.items())}
    n_codec = sum(v.numel() for k, v in tensors.items() if k.startswith("decoder."))
    save_file(tensors, str(st / "model.safetensors"), metadata={"format": "pt"})
    (st / "config.json").write_text(json.dumps(ccfg, indent=2))
    from tests.helpers.qwen3_tiny_codec import PREPROCESSOR_CONFIG

    (st / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    print(f"# checkpoint {size}: {n_params / 1e6:.0f}M talker params, {n_codec / 1e6:.0f}M decoder params, "
          f"{time.time() - t0:.1f}s -> {out}", flush=True)
    return out


def build_aligner(out: Path, device: str, seed: int = 0, text_layers: int = 28, audio_layers: int = 24) -> Path:
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    ids = aligner_tokenizer(out)
    cfg = tiny_aligner_config(ids, RELEASED_ALIGNER_TEXT["vocab_size"])
    cfg["thinker_config"]["audio_config"].update(RELEASED_ALIGNER_AUDIO, encoder_layers=audio_layers)
    cfg["thinker_config"]["text_config"].update(RELEASED_ALIGNER_TEXT, num_hidden_layers=text_layers)
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps(FEATURES, indent=1))
    with torch.device("meta"):
        module = ForcedAligner(load_aligner_config(out))
    module = module.to_empty(device=device).to(torch.bfloat16)
    _randomise(module, device, seed)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"# forced aligner: {sum(v.numel() for v in state.values()) / 1e6:.0f}M params, {time.time() - t0:.1f}s "
          f"-> {out}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(TALKER), default="1.7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=28,
                    help="talker (or aligner text body) layers (fewer only for CPU smoke tests)")
    ap.add_argument("--aligner", action="store_true", help="write a Qwen3-ForcedAligner-0.6B checkpoint instead")
    args = ap.parse_args()
    if args.aligner:
        build_aligner(Path(args.out), args.device, text_layers=args.layers)
    else:
        build(args.size, Path(args.out), args.device, layers=args.layers)


if __name__ == "__main__":
    main()

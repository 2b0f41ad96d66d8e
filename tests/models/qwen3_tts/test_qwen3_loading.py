"""Checkpoint loading: sharded safetensors, strict key names, upstream-shaped config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamvox.models.qwen3_tts.config import parse_config
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from tests.helpers.qwen3_tiny import build_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("load"), "base", seed=2)


def test_sharded_checkpoint_loads_like_single_file(ckpt, tmp_path):
    sharded = tmp_path / "sharded"
    shutil.copytree(ckpt, sharded)
    state = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    keys = sorted(state)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in halves.items():
        save_file({k: state[k] for k in ks}, str(sharded / name))
    weight_map = {k: name for name, ks in halves.items() for k in ks}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a = Qwen3TTSModel.from_pretrained(ckpt).module.state_dict()
    b = Qwen3TTSModel.from_pretrained(sharded).module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("speaker_encoder.") for k in a)


def test_unexpected_or_missing_keys_are_refused(ckpt, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    state = load_file(str(bad / "model.safetensors"))
    state["talker.extra.weight"] = torch.zeros(1)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(RuntimeError, match="talker.extra.weight"):
        Qwen3TTSModel.from_pretrained(bad)


def test_parse_upstream_shaped_config():
    cfg = parse_config({
        "model_type": "qwen3_tts", "tts_model_type": "custom_voice", "tts_model_size": "1b7",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "talker_config": {
            "model_type": "qwen3_tts_talker", "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "rope_theta": 1000000, "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20],
                                                    "rope_type": "default", "type": "default"},
            "vocab_size": 3072, "text_vocab_size": 151936, "text_hidden_size": 2048, "num_code_groups": 16,
            "codec_eos_token_id": 2150, "spk_id": {"vivian": 3065}, "spk_is_dialect": {"vivian": False},
            "codec_language_id": {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062},
            "use_sliding_window": False, "sliding_window": None, "position_id_per_seconds": 13,
            "code_predictor_config": {"hidden_size": 1024, "num_hidden_layers": 5, "num_code_groups": 16,
                                      "vocab_size": 2048, "layer_types": ["full_attention"] * 5,
                                      "rope_scaling": None, "max_window_layers": 28},
        },
        "speaker_encoder_config": {"enc_dim": 2048, "sample_rate": 24000, "unknown_key": 1},
    })
    t = cfg.talker
    assert (t.hidden_size, t.head_dim, t.num_key_value_heads, t.mrope_section) == (2048, 128, 8, [24, 20, 20])
    assert t.mrope_interleaved and t.code_predictor is not None and t.code_predictor.mrope_section is None
    assert t.code_predictor.head_dim == 128 and t.code_predictor.vocab_size == 2048
    assert cfg.languages == ["auto", "english", "chinese"] and cfg.speakers == ["vivian"]
    assert cfg.speaker_encoder.enc_dim == 2048 and cfg.tts_pad_token_id == 151671
    with pytest.raises(ValueError, match="rope_type"):
        parse_config({"talker_config": {"rope_scaling": {"rope_type": "yarn"}}})

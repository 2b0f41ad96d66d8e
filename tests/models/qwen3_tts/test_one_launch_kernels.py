"""The one-launch kernels, the code predictor's passes (kernels/predictor.py) and the talker's layers
(kernels/talker.py): where they are used, and on a GPU, against the per-layer Triton kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamvox.models.qwen3_tts.kernels import build as kernel_build
from streamvox.models.qwen3_tts.kernels import predictor as predictor_kernel
from streamvox.models.qwen3_tts.kernels import talker as talker_kernel
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache
from streamvox.settings import Qwen3Settings
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[3]


def test_kernel_only_for_the_shapes_it_is_built_for(tmp_path) -> None:
    model = Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice"))
    assert predictor_kernel.unsupported(model) == "code predictor hidden_size 24 (the kernel is built for 1024)"
    with pytest.raises(RuntimeError, match="hidden_size 24"):  # required: an unsupported model is an error
        predictor_kernel.predictor_passes(model, None, None, None, "1")
    assert predictor_kernel.predictor_passes(model, None, None, None, "auto") is None
    assert predictor_kernel.predictor_passes(model, None, None, None, "0") is None
    tc = model.cfg.talker
    cache = SlotCache(tc.num_hidden_layers, 3, tc.num_key_value_heads, 64, tc.head_dim, model.dtype, model.device)
    stepper = FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                           use_kernels=True)
    assert stepper.pred_kernel is None  # on the CPU one-row steps keep the per-layer kernels
    with pytest.raises(RuntimeError, match="predictor kernel: code predictor hidden_size 24"):
        FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                     use_kernels=True, settings=Qwen3Settings(predictor_kernel="1"))


def test_talker_kernel_only_for_the_shapes_it_is_built_for(tmp_path) -> None:
    model = Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice"))
    assert talker_kernel.unsupported(model, 64).startswith("talker hidden_size ")
    tc = model.cfg.talker
    cache = SlotCache(tc.num_hidden_layers, 3, tc.num_key_value_heads, 64, tc.head_dim, model.dtype, model.device)
    with pytest.raises(RuntimeError, match="talker kernel: talker hidden_size"):  # required: unsupported is an error
        talker_kernel.talker_layers(model, None, cache, "1")
    assert talker_kernel.talker_layers(model, None, cache, "auto") is None
    assert talker_kernel.talker_layers(model, None, cache, "0") is None
    stepper = FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                           use_kernels=True)
    assert stepper.talk_kernel is None
    with pytest.raises(RuntimeError, match="talker kernel: talker hidden_size"):
        FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                     use_kernels=True, settings=Qwen3Settings(talker_kernel="1"))


@pytest.mark.parametrize(("hidden", "intermediate", "why"), [
    (2048, 6144, "not on CUDA"),  # the released 1.7B talker: only the device is missing
    (1024, 3072, "not on CUDA"),  # the 0.6B
    (1024, 6144, "talker hidden_size 1024 with intermediate_size 6144"),
    (1536, 4608, "talker hidden_size 1536 with intermediate_size 4608"),
])
def test_talker_kernel_is_built_for_both_released_sizes(tmp_path, hidden, intermediate, why) -> None:
    model = Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice"),
                                          dtype=torch.bfloat16)
    tc = model.cfg.talker
    for name, value in dict(talker_kernel.SHAPE, hidden_size=hidden, intermediate_size=intermediate).items():
        setattr(tc, name, value)  # the released sizes in the config only: no weights of that size are needed
    assert talker_kernel.unsupported(model, 64).startswith(why)


def test_next_inputs_are_the_projected_embeddings() -> None:
    """The kernel reads each pass's input from the code embeddings projected once at build time: they must be
    what the projection gives (rounded once to bfloat16), and the tables themselves for an identity."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(48, 16).to(torch.bfloat16)
    tables = [torch.randn(32, 48, dtype=torch.bfloat16) for _ in range(3)]
    got = predictor_kernel.PredictorPasses._projected(proj, tables)
    assert got.shape == (3, 32, 16) and got.dtype == torch.bfloat16
    for table, rows in zip(tables, got, strict=True):
        want = torch.nn.functional.linear(table.float(), proj.weight.float(), proj.bias.float())
        assert torch.allclose(rows.float(), want, rtol=2**-8, atol=1e-6)  # within one bfloat16 rounding
    assert predictor_kernel.PredictorPasses._projected(torch.nn.Identity(), tables) is tables


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel needs a GPU")
@pytest.mark.parametrize("size", ["1.7b", "0.6b"])
@pytest.mark.parametrize("which", ["predictor", "talker"])
def test_kernel_matches_per_layer_kernels_on_gpu(tmp_path, which, size) -> None:  # pragma: no cover - GPU only
    out = tmp_path / "q"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_real_shape_checkpoint.py"), "--size", size,
                    "--out", str(out)], check=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_bench import one_launch_kernel

    res = one_launch_kernel(str(out), which, states=8)
    assert res["graph_identical_to_eager"]
    # greedy codes of random weights flip on near-ties between two summation orders (on the H200 16 of 24 steps
    # agreed for the predictor, 21 for the talker); where the codes agree, so do the caches and hidden states
    # (worst relative error 0.0086 for the predictor; 0.031-0.035 for the talker, whose 28 random layers
    # amplify the rounding differences)
    assert res["identical_frames"] >= 4
    assert res["worst_rel_err_when_identical"] < {"predictor": 0.03, "talker": 0.06}[which]


def test_kernel_grid_leaves_the_decoder_its_multiprocessors() -> None:
    """`decoder_sms` multiprocessors are left out of the kernels' grid; a value that would leave the kernels none,
    or is not a number, is refused with the variable's name."""
    assert kernel_build.kernel_grid(132) == 132
    assert kernel_build.kernel_grid(132, Qwen3Settings().decoder_sms) == 132
    assert kernel_build.kernel_grid(132, "8") == 124
    for bad in ("132", "-1", "four", ""):
        with pytest.raises(ValueError, match="STREAMVOX_QWEN3_DECODER_SMS"):
            kernel_build.kernel_grid(132, bad)

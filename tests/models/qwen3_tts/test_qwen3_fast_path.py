"""The slot-indexed frame step (`runtime/fast_path.FrameStepper`) with greedy requests against the eager runner
path (sampled requests: test_qwen3_fast_sampling.py).

On the CPU the stepper runs eagerly (no graphs); the logic (slot rows, inactive rows, masks, lagged
end-of-speech, repetition penalty) is the same code the GPU captures. GPU-only checks (graph replay
equal to eager) live in benchmarks/gpu_bench.py and are skipped here without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from streamvox.contract import SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.settings import Qwen3Settings
from tests.helpers.qwen3_harness import FrameLog, RecordingSink, drain
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

TEXTS = [
    "Hello world, this is a test.",
    "Streaming text arrives word by word.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers like 12 and 345!",
    "Speak softly, please.",
]


@pytest.fixture(scope="module", params=[24, 32], ids=["projection", "identity"])
def model(tmp_path_factory, request) -> Qwen3TTSModel:
    """The 1.7B layout (a linear projection into the code predictor) and the 0.6B one (none: an identity)."""
    path = build_tiny_checkpoint(tmp_path_factory.mktemp("fast") / "ckpt", "custom_voice",
                                 predictor_hidden=request.param)
    model = Qwen3TTSModel.from_pretrained(path)
    identity = isinstance(model.talker.code_predictor.small_to_mtp_projection, torch.nn.Identity)
    assert identity == (request.param == 32)
    return model


def _requests(streaming: bool) -> list[SpeechRequest]:
    out = []
    for i, text in enumerate(TEXTS):
        out.append(SpeechRequest(
            request_id=f"r{i}", text=text, voice=["alice", "bob"][i % 2], language="english",
            text_complete=not streaming,
            sampling=SamplingParams(temperature=0.0, max_new_tokens=20 + 3 * i),
        ))
    return out


def _run(model, fast: str, streaming: bool, ignore_eos: bool = False, **settings) -> tuple[dict, dict]:
    log = FrameLog()
    runner = Qwen3TTSRunner(model, None, max_batch=8, max_seq_len=512, on_frame=log,
                            settings=Qwen3Settings(fast=fast, ignore_eos=ignore_eos, **settings))
    assert (runner.stepper is not None) == (fast == "1")
    sink = RecordingSink()
    reqs = _requests(streaming)
    for r in reqs[:3]:
        runner.add(r)
    for _ in range(3):
        runner.step(sink)
    for r in reqs[3:]:
        runner.add(r)
    if streaming:
        for _ in range(4):
            runner.step(sink)
        for r in reqs:
            runner.feed_text(r.request_id, " and more words arrive")
            runner.step(sink)
            runner.end_input(r.request_id)
    drain(runner, sink)
    assert not sink.errors
    assert sorted(runner.free_slots) == list(range(8))
    return log.frames, sink.done


@pytest.mark.parametrize("streaming", [False, True])
def test_fast_path_equals_eager(model, streaming: bool) -> None:
    eager, done_e = _run(model, "0", streaming)
    fast, done_f = _run(model, "1", streaming)
    assert done_e == done_f
    assert eager == fast


def _fused_parts(layer) -> dict[str, tuple[torch.nn.Linear, ...]]:
    a, m = layer.self_attn, layer.mlp
    return {"w_qkv": (a.q_proj, a.k_proj, a.v_proj), "w_gu": (m.gate_proj, m.up_proj)}


def test_fused_weights_are_the_layers_own(model) -> None:
    """The stepper's concatenated q/k/v and gate/up weights are the layers' parameters themselves (views of
    one tensor, no second copy in memory), and the layers compute as before."""
    tc = model.cfg.talker
    layers = [*model.talker.model.layers, *model.talker.code_predictor.model.layers]
    xs = [torch.randn(3, layer.self_attn.q_proj.in_features) for layer in layers]

    def outputs() -> list[torch.Tensor]:
        return [lin(x) for layer, x in zip(layers, xs, strict=True) for part in _fused_parts(layer).values()
                for lin in part]

    before = outputs()
    cache = SlotCache(tc.num_hidden_layers, 3, tc.num_key_value_heads, 16, tc.head_dim, model.dtype, model.device)
    st = FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                      use_graphs=False)
    for layer, fused in zip(layers, st.tstack.layers + st.pstack.layers, strict=True):
        for name, part in _fused_parts(layer).items():
            offset = 0
            for lin in part:
                assert lin.weight.data_ptr() == fused[name][offset].data_ptr()
                offset += lin.out_features
            assert offset == fused[name].shape[0]
    assert all(torch.equal(b, a) for b, a in zip(before, outputs(), strict=True))


def test_ignore_eos_runs_to_length(model) -> None:
    frames, done = _run(model, "1", False, ignore_eos=True)
    for i in range(len(TEXTS)):
        assert done[f"r{i}"][0] == "length"
        assert len(frames[f"r{i}"]) == 20 + 3 * i
    eager, done_e = _run(model, "0", False, ignore_eos=True)
    assert eager == frames and done_e == done


def test_sampled_requests_take_the_fast_path(model, caplog) -> None:
    runner = Qwen3TTSRunner(model, None, max_batch=4, settings=Qwen3Settings(fast="1"))
    sink = RecordingSink()
    for i, temperature in enumerate((0.0, 0.9, None)):
        runner.add(SpeechRequest(request_id=f"r{i}", text=TEXTS[i], voice="alice", language="english",
                                 sampling=SamplingParams(temperature=temperature, max_new_tokens=4)))
    with caplog.at_level("WARNING", logger="streamvox.models.qwen3_tts.runtime.scheduler"):
        runner.step(sink)
    assert [runner.requests[f"r{i}"].fast for i in range(3)] == [True, True, True]
    assert [runner.requests[f"r{i}"].sampled for i in range(3)] == [False, True, True]
    assert not caplog.records
    drain(runner, sink)
    assert set(sink.done) == {"r0", "r1", "r2"} and not sink.errors


def _burst(model, batched: bool, n: int = 8, bucketed: bool = False) -> tuple[dict, dict, list[int]]:
    """n greedy requests of different prompt lengths arrive at once; returns frames, finishes and the
    number of prompts prefilled by the first step. `bucketed`: the prefill goes through the static
    bucketed buffers that the GPU's prefill graphs capture (rows padded onto the scratch slot)."""
    log = FrameLog()
    runner = Qwen3TTSRunner(model, None, max_batch=8, max_seq_len=512, on_frame=log,
                            settings=Qwen3Settings(fast="1", batch_prefill=batched))
    runner.stepper.bucketed_prefill = bucketed
    sink = RecordingSink()
    for i in range(n):
        text = " ".join([TEXTS[i % len(TEXTS)]] * (1 + i % 3))  # prompts of different lengths
        runner.add(SpeechRequest(request_id=f"b{i}", text=text, voice=["alice", "bob"][i % 2], language="english",
                                 sampling=SamplingParams(temperature=0.0, max_new_tokens=12 + i)))
    runner.step(sink)
    admitted = [r.prompt_tokens for r in runner.requests.values() if r.slot is not None]
    drain(runner, sink)
    assert not sink.errors
    assert sorted(runner.free_slots) == list(range(8))
    return log.frames, sink.done, admitted


def test_batched_prefill_equals_one_at_a_time(model) -> None:
    one, done_one, admitted_one = _burst(model, False)
    many, done_many, admitted_many = _burst(model, True)
    assert len(admitted_many) == 8 and len(set(admitted_many)) > 1  # one step, ragged prompts
    assert admitted_one == admitted_many
    assert done_one == done_many
    assert one == many
    # and both equal the original eager runner path (one eager prefill per request)
    log = FrameLog()
    runner = Qwen3TTSRunner(model, None, max_batch=8, max_seq_len=512, on_frame=log,
                            settings=Qwen3Settings(fast="0"))
    sink = RecordingSink()
    for i in range(8):
        text = " ".join([TEXTS[i % len(TEXTS)]] * (1 + i % 3))
        runner.add(SpeechRequest(request_id=f"b{i}", text=text, voice=["alice", "bob"][i % 2], language="english",
                                 sampling=SamplingParams(temperature=0.0, max_new_tokens=12 + i)))
    drain(runner, sink)
    assert log.frames == many and sink.done == done_many


def test_bucketed_prefill_equals_unpadded(model) -> None:
    """5 prompts go into the 8-row bucket (3 padded rows write to the scratch slot) and the 64-position
    length bucket: the same frames as the unpadded batched prefill."""
    plain, done_plain, admitted = _burst(model, True, n=5)
    padded, done_padded, _ = _burst(model, True, n=5, bucketed=True)
    assert len(admitted) == 5 and max(admitted) < 64
    assert padded == plain and done_padded == done_plain


def test_batched_prefill_respects_the_token_cap(model) -> None:
    log = FrameLog()
    runner = Qwen3TTSRunner(model, None, max_batch=8, max_seq_len=512, on_frame=log, max_prefill_tokens=64,
                            settings=Qwen3Settings(fast="1", batch_prefill=True))
    calls = []
    orig = runner.stepper.prefill_batch
    runner.stepper.prefill_batch = lambda slots, embeds: (calls.append([e.shape[0] for e in embeds]),
                                                          orig(slots, embeds))[1]
    sink = RecordingSink()
    for i in range(6):
        runner.add(SpeechRequest(request_id=f"c{i}", text=TEXTS[i % len(TEXTS)], voice="alice", language="english",
                                 sampling=SamplingParams(temperature=0.0, max_new_tokens=5)))
    runner.step(sink)
    assert sum(len(c) for c in calls) == 6 and len(calls) > 1
    assert all(max(c) * len(c) <= 64 or len(c) == 1 for c in calls)
    drain(runner, sink)
    assert set(sink.done) == {f"c{i}" for i in range(6)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_on_gpu(tmp_path) -> None:  # pragma: no cover - GPU only
    path = build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice")
    gpu = Qwen3TTSModel.from_pretrained(path, device="cuda", dtype=torch.float32)
    eager, done_e = _run(gpu, "1", False, warmup_widths="", cuda_graphs=False)
    graph, done_g = _run(gpu, "1", False, warmup_widths="", cuda_graphs=True)
    assert done_e == done_g and eager == graph

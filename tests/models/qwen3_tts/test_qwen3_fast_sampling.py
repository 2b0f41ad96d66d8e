"""The fast path's graph-capturable sampling (`runtime/fast_sampling.py`): its warp against `sampling._warp`, its
draws' frequencies against the softmax of the warped logits, and sampled requests through the fast path on the
CPU (STREAMVOX_QWEN3_FAST=1 runs the same code the GPU captures): batch independence, seeds, greedy rows beside
sampled ones, audio through the real codec."""

from __future__ import annotations

import pytest
import torch

from streamvox.contract import SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper
from streamvox.models.qwen3_tts.runtime.fast_sampling import mix64, sampled_scores, seed_bits, warp
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache
from streamvox.models.qwen3_tts.runtime.loader import load_runner
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.models.qwen3_tts.sampling import SamplerSettings, _warp, apply_repetition_penalty
from streamvox.settings import Qwen3Settings
from tests.helpers.qwen3_harness import FrameLog, RecordingSink, drain
from tests.helpers.qwen3_tiny import build_tiny_checkpoint
from tests.helpers.qwen3_tiny_codec import build_tiny_speech_tokenizer

TEXTS = ["Hello world, this is a test.", "Streaming text arrives word by word.",
         "The quick brown fox jumps over the lazy dog.", "Speak softly, please."]
DRAWS = 40_000  # per setting: a frequency's standard deviation is at most 0.0025
TOLERANCE = 0.0125  # five of those


def _splitmix64_mixer(x: int) -> int:
    m = (1 << 64) - 1
    x &= m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_mixer_is_splitmix64() -> None:
    values = [0, 1, 12345, -1, 1 << 62, -(1 << 63), seed_bits((1 << 64) - 5)]
    got = mix64(torch.tensor(values)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [_splitmix64_mixer(v) for v in values]
    assert seed_bits((1 << 64) - 5) == -5 and seed_bits(7) == 7


SETTINGS = [SamplerSettings(1.0, 0, 1.0), SamplerSettings(0.7, 0, 1.0), SamplerSettings(1.3, 5, 1.0),
            SamplerSettings(0.9, 0, 0.8), SamplerSettings(0.9, 6, 0.7), SamplerSettings(1.0, 50, 1.0),
            SamplerSettings(0.5, 1, 1.0), SamplerSettings(2.0, 3, 0.3)]


def _params(settings: list[SamplerSettings], n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each setting's (temperature, top_k, top_p) repeated over n rows."""
    t = torch.tensor([s.temperature for s in settings]).repeat_interleave(n)
    k = torch.tensor([s.top_k for s in settings]).repeat_interleave(n)
    p = torch.tensor([s.top_p for s in settings]).repeat_interleave(n)
    return t, k, p


def test_warp_matches_sampling_warp_per_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(len(SETTINGS), 40) * 2
    logits[:, 3] = float("-inf")  # a suppressed id
    t, k, p = _params(SETTINGS, 1)
    got = warp(logits, t, k, p)
    for i, s in enumerate(SETTINGS):
        want = _warp(logits[i], s)
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want)), s
        finite = ~torch.isinf(want)
        torch.testing.assert_close(got[i][finite], want[finite], rtol=1e-6, atol=0)


def _expected(logits: torch.Tensor, s: SamplerSettings) -> torch.Tensor:
    return _warp(logits.float(), s).softmax(-1)


def _assert_frequencies(picks: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    freq = torch.bincount(picks, minlength=probs.shape[0]).double() / picks.numel()
    assert not freq[probs == 0].any(), f"{what}: an id outside the warped support was drawn"
    err = float((freq - probs.double()).abs().max())
    assert err < TOLERANCE, f"{what}: max abs frequency error {err:.4f}"
    support = probs > 1e-3  # Pearson's statistic over the ids with enough mass: mean df, sd sqrt(2 df)
    chi2 = float(((freq[support] - probs[support]) ** 2 / probs[support]).sum()) * picks.numel()
    df = int(support.sum()) - 1
    assert chi2 < df + 6 * (2 * df) ** 0.5 + 6, f"{what}: chi-square {chi2:.1f} over {df} degrees of freedom"


def test_draws_follow_the_warped_softmax() -> None:
    """Each setting's rows in one batch (per-row parameters): seeds differ row to row in one half of them, the
    frame counter in the other (one seed); the draws' frequencies match softmax(warp(logits))."""
    torch.manual_seed(1)
    v = 16
    logits = torch.randn(v) * 1.5
    logits[9] = float("-inf")
    t, k, p = _params(SETTINGS, DRAWS)
    rows = t.numel()
    half = rows // 2
    seed = torch.cat([torch.arange(half) * 7919 + 3, torch.full((rows - half,), 1234)])
    counter = torch.cat([torch.zeros(half, dtype=torch.long), torch.arange(rows - half)])
    picks = sampled_scores(logits.expand(rows, v).clone(), t, k, p, seed, counter, 5).argmax(-1)
    for i, s in enumerate(SETTINGS):
        _assert_frequencies(picks[i * DRAWS:(i + 1) * DRAWS], _expected(logits, s), str(s))


def test_greedy_rows_keep_their_scores() -> None:
    logits = torch.randn(3, 20)
    t, k, p = torch.tensor([0.0, 0.9, 0.0]), torch.tensor([50, 50, 0]), torch.tensor([1.0, 0.9, 1.0])
    out = sampled_scores(logits, t, k, p, torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long), 0)
    assert torch.equal(out[[0, 2]], logits[[0, 2]]) and not torch.equal(out[1], logits[1])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Qwen3TTSModel:
    return Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path_factory.mktemp("fs") / "ckpt"))


def test_talker_draws_follow_penalty_masks_and_warp(model) -> None:
    """The talker's codebook-0 scores through `FrameStepper._scores`: repetition penalty over the slot's seen ids,
    the suppressed ids and the early end-of-speech mask, then the warp and the noise; the draws' frequencies
    match sampling.py's `apply_repetition_penalty`, the masks and `_warp` (as `EagerPath.choose`)."""
    tc = model.cfg.talker
    slots, frames = 1000, DRAWS // 1000
    eos = tc.codec_eos_token_id
    suppress = torch.zeros(tc.vocab_size, dtype=torch.bool)
    suppress[200:eos] = True
    cache = SlotCache(1, slots, 1, 1, 1, torch.float32, model.device)
    st = FrameStepper(model, cache, suppress, eos, 2, use_graphs=False)
    st.bucketed_prefill = False
    s = SamplerSettings(0.8, 7, 0.9, 1.6)
    for slot in range(slots):
        st.reset_slot(slot, s.repetition_penalty, s, None, seed=slot)
    logits = torch.full((tc.vocab_size,), -40.0)
    ids = torch.tensor([1, 5, 9, 17, 60, 150, 199, 205, eos, 250])
    logits[ids] = torch.tensor([2.0, 1.5, -0.2, 1.0, 0.4, 1.9, 0.1, 5.0, 3.0, 0.0])
    history = torch.tensor([1, 9, 150, 1])  # seen: a positive, a negative and a repeated id
    st.seen[:, history] = True
    probs = {}
    for count in (1, 3):  # end-of-speech banned below the minimum of 2 ids
        st.count.fill_(count)
        picks = []
        for f in range(frames):  # fresh seeds for each batch of draws
            st.sampling.seed.copy_(torch.arange(slots) + f * slots)
            picks.append(st._choose(logits.expand(slots, -1).clone(), slice(0, slots), sample=True))
        mask = suppress.clone()
        mask[eos] = count < 2
        want = apply_repetition_penalty(logits, history, s.repetition_penalty).masked_fill(mask, float("-inf"))
        probs[count] = _expected(want, s)
        _assert_frequencies(torch.cat(picks), probs[count], f"count {count}")
    unpenalised = _expected(logits.masked_fill(suppress, float("-inf")), s)
    assert probs[1][eos] == 0 and probs[3][eos] > 0.05 and probs[3][1] < unpenalised[1]
    greedy = st._choose(logits[None].clone(), slice(0, 1))
    want = apply_repetition_penalty(logits, history, s.repetition_penalty).masked_fill(suppress, float("-inf"))
    assert int(greedy) == int(want.argmax()) == eos


def _request(rid: str, i: int, temperature: float | None, seed: int | None, max_new: int = 16) -> SpeechRequest:
    return SpeechRequest(request_id=rid, text=TEXTS[i % len(TEXTS)], voice=["alice", "bob"][i % 2],
                         language="english", sampling=SamplingParams(temperature=temperature, seed=seed,
                                                                     max_new_tokens=max_new))


def _frames(model, requests: list[SpeechRequest], fast: str = "1") -> tuple[dict, dict, Qwen3TTSRunner]:
    log = FrameLog()
    runner = Qwen3TTSRunner(model, None, max_batch=6, max_seq_len=512, on_frame=log,
                            settings=Qwen3Settings(fast=fast))
    sink = RecordingSink()
    for r in requests:
        runner.add(r)
    runner.step(sink)
    assert all(r.fast == (fast == "1") for r in runner.requests.values())
    drain(runner, sink)
    assert not sink.errors
    assert sorted(runner.free_slots) == list(range(6))
    return log.frames, sink.done, runner


def test_seeded_sampled_request_is_batch_independent(model) -> None:
    """A seeded sampled request (the checkpoint's sampling defaults) gives the same frames alone and in slot 4
    beside greedy and other sampled requests; another seed gives other frames, and neither is greedy's."""
    alone, done_alone, _ = _frames(model, [_request("s", 2, None, seed=42)])
    others = [_request("g0", 0, 0.0, None), _request("a", 1, 0.9, seed=7), _request("g1", 3, 0.0, None),
              _request("b", 0, None, seed=None)]
    beside, done_beside, _ = _frames(model, others + [_request("s", 2, None, seed=42)])
    assert beside["s"] == alone["s"] and done_beside["s"] == done_alone["s"]
    other_seed, _, _ = _frames(model, [_request("s", 2, None, seed=43)])
    greedy, _, _ = _frames(model, [_request("s", 2, 0.0, None)])
    assert other_seed["s"] != alone["s"] and greedy["s"] != alone["s"]
    assert beside["a"] != beside["b"]


def test_greedy_rows_beside_sampled_rows_match_the_eager_path(model) -> None:
    reqs = [_request("g0", 0, 0.0, None), _request("s0", 1, 0.9, 3), _request("g1", 2, 0.0, None),
            _request("s1", 3, None, None)]
    fast, done_fast, _ = _frames(model, reqs)
    eager, done_eager, _ = _frames(model, [reqs[0], reqs[2]], fast="0")
    for rid in ("g0", "g1"):
        assert fast[rid] == eager[rid] and done_fast[rid] == done_eager[rid]


def test_sampled_request_streams_audio_on_the_fast_path(tmp_path) -> None:
    path = build_tiny_checkpoint(tmp_path / "ckpt", codebook_size=64,
                                 speech_tokenizer_builder=lambda d: build_tiny_speech_tokenizer(d, seed=3))
    runner = load_runner(path, settings=Qwen3Settings(fast="1"))
    assert runner.codec is not None and runner.stepper is not None
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="s", text=TEXTS[0], voice="alice", language="english",
                             sampling=SamplingParams(max_new_tokens=24), initial_codec_chunk_frames=3))
    runner.step(sink)
    req = runner.requests["s"]
    assert req.fast and req.sampled
    drain(runner, sink)
    assert sink.done["s"][0] in ("stop", "length") and 0 < sink.done["s"][2] <= 24
    chunks = sink.audio_chunks["s"]
    assert len(chunks) >= 2 and sum(len(c) for c in chunks) > 0
    assert sorted(runner.free_slots) == list(range(len(runner.free_slots)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_sampled_graph_replay_equals_eager_on_gpu(tmp_path) -> None:  # pragma: no cover - GPU only
    gpu = Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path / "ckpt"), device="cuda", dtype=torch.float32)
    reqs = [_request("g", 0, 0.0, None, 20), _request("s", 1, None, 5, 20), _request("t", 2, 0.7, 9, 20)]

    def run(graphs: bool) -> tuple[dict, dict]:
        log = FrameLog()
        runner = Qwen3TTSRunner(gpu, None, max_batch=4, max_seq_len=512, on_frame=log,
                                settings=Qwen3Settings(fast="1", warmup_widths="", cuda_graphs=graphs))
        sink = RecordingSink()
        for r in reqs:
            runner.add(r)
        drain(runner, sink)
        assert not sink.errors and all(r in sink.done for r in ("g", "s", "t"))
        return log.frames, sink.done

    eager, done_e = run(False)
    graph, done_g = run(True)
    assert done_e == done_g and eager == graph


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled Triton kernel needs a GPU")
def test_sampling_kernel_matches_torch_on_gpu() -> None:  # pragma: no cover - GPU only
    from streamvox.models.qwen3_tts.kernels.triton_sampling import sample_scores

    torch.manual_seed(0)
    t = torch.tensor([0.9, 0.0, 1.0, 0.5, 1.3, 0.9], device="cuda")
    k = torch.tensor([50, 0, 0, 7, 5000, 50], device="cuda")
    p = torch.tensor([1.0, 1.0, 0.8, 0.95, 1.0, 1.0], device="cuda")
    seed = torch.tensor([0, 5, -(1 << 63), (1 << 63) - 1, 123456789, 42], device="cuda")
    counter = torch.tensor([0, 1, 7, 300, 2, 1 << 40], device="cuda")
    for v in (2048, 3072):
        logits = torch.randn(6, v, device="cuda") * 3
        logits[:, 2000:2040] = float("-inf")
        for codebook in (0, 1, 15):
            want = sampled_scores(logits, t, k, p, seed, counter, codebook)
            got = sample_scores(logits, t, k, p, seed, counter, codebook)
            assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[1], logits[1])
            finite = ~torch.isinf(want)
            torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=1e-5)
            assert torch.equal(got.argmax(-1), want.argmax(-1))

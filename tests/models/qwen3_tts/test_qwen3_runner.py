"""Qwen3TTSRunner: continuous batching, streaming text, chunking, validation (tiny random checkpoints)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamvox.contract import RequestError, SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.openai_voices import OPENAI_VOICES
from streamvox.models.qwen3_tts.runtime.loader import load_runner
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.settings import Qwen3Settings
from tests.helpers.qwen3_harness import FrameLog, RecordingSink, drain, make_signal, pcm_bytes, run_solo
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

TEXTS = [
    "Hello world, this is a test.",
    "Streaming text arrives word by word.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers like 12 and 345!",
    "Speak softly, please.",
    "Does it work? Yes: it does.",
    "Again and again.",
    "A warm and gentle voice.",
]
VOICES = ["alice", "bob", "dylan"]
LANGS = ["english", "auto", "chinese"]


class FakeCodec:
    """Deterministic stand-in for the streaming code2wav: 4 samples per frame, stateful offset."""

    sample_rate = 24000
    samples_per_frame = 4

    def __init__(self) -> None:
        self.calls: list[list[int]] = []  # frames per row of each decode_stream call
        self.seen: list[torch.Tensor] = []

    def new_stream_state(self) -> dict:
        return {"frames": 0}

    def release_stream(self, state) -> None:
        state["released"] = True

    def decode_stream(self, codes_list, states):
        self.calls.append([c.shape[1] for c in codes_list])
        outs = []
        for codes, st in zip(codes_list, states, strict=True):
            self.seen.append(codes.clone())
            t = codes.shape[1]
            idx = torch.arange(t) + st["frames"]
            val = (codes[0].float() + 0.5 * codes[1].float() + idx) / 1000.0
            outs.append(val.repeat_interleave(self.samples_per_frame))
            st["frames"] += t
        return outs

    @staticmethod
    def offline(codes: list[list[int]]) -> np.ndarray:
        c = torch.tensor(codes).t()
        val = (c[0].float() + 0.5 * c[1].float() + torch.arange(c.shape[1])) / 1000.0
        return val.repeat_interleave(FakeCodec.samples_per_frame).numpy()


@pytest.fixture(scope="module")
def cv_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", seed=11)


@pytest.fixture(scope="module")
def cv_model(cv_dir):
    return Qwen3TTSModel.from_pretrained(cv_dir)


def _runner(model, **kw) -> tuple[Qwen3TTSRunner, FrameLog, FakeCodec]:
    log, codec = FrameLog(), FakeCodec()
    return Qwen3TTSRunner(model, codec, on_frame=log, **kw), log, codec


def _requests(n: int, sampling: SamplingParams) -> list[SpeechRequest]:
    return [
        SpeechRequest(
            request_id=f"r{i}", text=TEXTS[i % len(TEXTS)], voice=VOICES[i % 3], language=LANGS[(i // 3) % 3],
            sampling=SamplingParams(temperature=sampling.temperature, seed=1000 + i,
                                    max_new_tokens=4 + (i * 5) % 7),
        )
        for i in range(n)
    ]


def _concurrent(model, reqs: list[SpeechRequest], max_batch: int = 16):
    runner, log, codec = _runner(model, max_batch=max_batch)
    sink = RecordingSink()
    # Staggered arrivals: half join at once, the rest one per step while others run.
    for r in reqs[: len(reqs) // 2]:
        runner.add(r)
    for r in reqs[len(reqs) // 2:]:
        runner.step(sink)
        runner.add(r)
    drain(runner, sink)
    return log.frames, sink, codec


def _solo(model, reqs: list[SpeechRequest]):
    frames, audio = {}, {}
    for r in reqs:
        runner, log, _ = _runner(model)
        sink = RecordingSink()
        runner.add(r)
        drain(runner, sink)
        frames[r.request_id] = log.frames.get(r.request_id, [])
        audio[r.request_id] = np.concatenate(sink.audio_chunks.get(r.request_id, [np.zeros(0, np.float32)]))
    return frames, audio


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_sixteen_concurrent_requests_equal_their_solo_runs(cv_model, temperature):
    reqs = _requests(16, SamplingParams(temperature=temperature))
    solo_frames, solo_audio = _solo(cv_model, reqs)
    frames, sink, codec = _concurrent(cv_model, reqs)
    assert set(sink.done) == {r.request_id for r in reqs} and not sink.errors
    assert max(len(c) for c in codec.calls) > 1, "chunks of several requests should share decoder calls"
    for r in reqs:
        rid = r.request_id
        assert frames[rid] == solo_frames[rid], rid
        audio = np.concatenate(sink.audio_chunks[rid])
        np.testing.assert_array_equal(audio, solo_audio[rid])
        assert sink.done[rid][2] == len(frames[rid])
    # The requests are not all the same (the comparison is meaningful).
    assert len({str(f) for f in solo_frames.values()}) == 16


def test_sampling_depends_on_seed_and_is_reproducible(cv_model):
    def run(seed):
        runner, log, _ = _runner(cv_model)
        return run_solo(runner, log, SpeechRequest(request_id="s", text=TEXTS[0], voice="alice",
                                                   sampling=SamplingParams(temperature=0.9, seed=seed,
                                                                           max_new_tokens=8)))
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_a_temperature_too_small_to_divide_by_is_greedy(cv_model):
    """Scores divided by 1e-40 overflow float32 (the draw failed, and took the engine with it): a temperature below
    `MIN_TEMPERATURE` is served as its limit, greedy."""
    def run(temperature: float) -> list:
        runner, log, _ = _runner(cv_model)
        sampling = SamplingParams(temperature=temperature, seed=1, max_new_tokens=8)
        return run_solo(runner, log, SpeechRequest(request_id="t", text=TEXTS[0], voice="alice", sampling=sampling))
    assert run(1e-40) == run(1e-6) == run(0.0)


def test_word_by_word_text_gives_the_same_codes_as_whole_text(cv_model):
    text = "Hello world,  this is a test of 12 streamed words!\nNew line too."
    greedy = SamplingParams(temperature=0, max_new_tokens=30)

    def streamed(pieces):
        runner, log, _ = _runner(cv_model)
        sink = RecordingSink()
        runner.add(SpeechRequest(request_id="w", text="", text_complete=False, voice="bob", sampling=greedy))
        for p in pieces:
            runner.feed_text("w", p)
            runner.step(sink)
        runner.end_input("w")
        drain(runner, sink)
        assert "w" in sink.done
        return log.frames["w"]

    whole = streamed([text])
    assert len(whole) > 5
    words = text.split(" ")
    assert streamed([w + " " for w in words[:-1]] + [words[-1]]) == whole
    assert streamed(list(text)) == whole  # character by character
    # The incremental tokeniser reproduces whole-text ids exactly.
    from streamvox.models.qwen3_tts.text import IncrementalText

    inc = IncrementalText(cv_model.tokenizer)
    ids = [i for ch in text for i in inc.feed(ch)] + inc.finish()
    assert ids == cv_model.tokenizer.text_ids(text)


def test_request_waiting_for_text_is_not_scheduled(cv_model):
    runner, log, _ = _runner(cv_model)
    sink = RecordingSink()
    greedy = SamplingParams(temperature=0, max_new_tokens=40)
    runner.add(SpeechRequest(request_id="w", text="Hello", text_complete=False, voice="alice",
                             sampling=greedy))
    assert not runner.has_work()  # "Hello" may still grow: nothing is committed yet
    runner.feed_text("w", " world, this")
    drain(runner, sink)  # runs only as far as the known text allows
    n = len(log.frames.get("w", []))
    for _ in range(5):
        runner.step(sink)
    assert len(log.frames.get("w", [])) == n, "a request without its next text token must not advance"
    assert "w" not in sink.done
    runner.feed_text("w", " is more text")
    runner.end_input("w")
    drain(runner, sink)
    assert "w" in sink.done


def test_chunking_sizes_deltas_and_offline_equality(cv_model):
    runner, log, codec = _runner(cv_model, codec_chunk_frames=5)
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="c", text=TEXTS[2], voice="alice", initial_codec_chunk_frames=3,
                             sampling=SamplingParams(temperature=0, max_new_tokens=14)))
    drain(runner, sink)
    frames = log.frames["c"]
    assert len(frames) == 14
    sizes = [len(c) // FakeCodec.samples_per_frame for c in sink.audio_chunks["c"]]
    assert sizes == [3, 5, 5, 1]
    np.testing.assert_array_equal(np.concatenate(sink.audio_chunks["c"]), FakeCodec.offline(frames))
    assert sink.done["c"] == ("length", len(cv_model.tokenizer.text_ids(TEXTS[2])), 14)


def test_default_chunks_start_small_and_double(cv_model):
    ignore_eos = Qwen3Settings(ignore_eos=True)
    runner, log, codec = _runner(cv_model, codec_chunk_frames=25, settings=ignore_eos)
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="d", text=TEXTS[2], voice="alice",
                             sampling=SamplingParams(temperature=0, max_new_tokens=60)))
    drain(runner, sink)
    sizes = [len(c) // FakeCodec.samples_per_frame for c in sink.audio_chunks["d"]]
    assert sizes == [1, 2, 4, 8, 16, 25, 4]
    np.testing.assert_array_equal(np.concatenate(sink.audio_chunks["d"]), FakeCodec.offline(log.frames["d"]))
    # with more streams too, the first chunk is one frame
    runner, log, codec = _runner(cv_model, codec_chunk_frames=25, settings=ignore_eos)
    sink = RecordingSink()
    for i in range(6):
        runner.add(SpeechRequest(request_id=f"m{i}", text=TEXTS[i], voice="bob",
                                 sampling=SamplingParams(temperature=0, max_new_tokens=40)))
    drain(runner, sink)
    for rid, chunks in sink.audio_chunks.items():
        sizes = [len(c) // FakeCodec.samples_per_frame for c in chunks]
        assert sizes == [1, 2, 4, 8, 16, 9], (rid, sizes)


def test_release_frees_slot_and_queue_waits_for_capacity(cv_model):
    runner, log, _ = _runner(cv_model, max_batch=2)
    sink = RecordingSink()
    for r in _requests(3, SamplingParams(temperature=0)):
        runner.add(r)
    runner.step(sink)
    assert len(runner.free_slots) == 0 and runner.requests["r2"].slot is None
    runner.release("r0")
    n0 = len(log.frames.get("r0", []))
    drain(runner, sink)
    assert "r0" not in sink.done and len(log.frames.get("r0", [])) == n0
    assert {"r1", "r2"} <= set(sink.done)
    assert sorted(runner.free_slots) == [0, 1] and not runner.requests
    runner.release("unknown")  # ignored


def test_validation_errors(cv_model, tmp_path):
    runner, _, _ = _runner(cv_model, max_instruction_tokens=8)

    def err(**kw) -> RequestError:
        with pytest.raises(RequestError) as e:
            runner.add(SpeechRequest(request_id="v", **{"text": "Hi there.", **kw}))
        return e.value

    assert err(voice="nobody").param == "voice"
    assert "alice" in err(voice="nobody").message
    assert err(language="klingon").param == "language"
    assert err(language="beijing_dialect").param == "language"  # dialects are not selectable
    assert err(instructions="word " * 40).param == "instructions"
    assert err(task_type="voice_design").param == "task_type"
    assert err(task_type="sing").param == "task_type"
    assert err(text="   ").param == "input"
    assert err(sampling=SamplingParams(temperature=-1)).param == "temperature"
    assert err(sampling=SamplingParams(top_p=0)).param == "top_p"
    assert err(sampling=SamplingParams(max_new_tokens=0)).param == "max_new_tokens"
    assert err(initial_codec_chunk_frames=0).param == "initial_codec_chunk_frames"
    runner.add(SpeechRequest(request_id="v", text="Hi."))
    assert err().param == "request_id"
    assert runner.info.voices == ["alice", "bob", "dylan", *OPENAI_VOICES]
    assert runner.info.task_types == ["custom_voice"]
    assert runner.info.streaming_text and "english" in runner.info.languages
    assert "beijing_dialect" not in runner.info.languages


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("base"), "base", seed=5)


def test_base_validation_and_in_context_decoder_priming(base_dir):
    ref_codes = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    model = Qwen3TTSModel.from_pretrained(base_dir)
    codec, log = FakeCodec(), FrameLog()
    runner = Qwen3TTSRunner(model, codec, reference_encoder=lambda pcm, sr: ref_codes, on_frame=log)
    audio = pcm_bytes(make_signal(16000, 0.5))

    def err(**kw) -> RequestError:
        with pytest.raises(RequestError) as e:
            runner.add(SpeechRequest(request_id="b", text="Hi there.", **kw))
        return e.value

    assert err().param == "ref_audio"
    assert err(ref_audio=b"\x00\x01\x02", ref_sample_rate=16000).param == "ref_audio"
    assert err(ref_audio=pcm_bytes(np.full(4000, np.nan)), ref_sample_rate=16000).param == "ref_audio"
    assert err(ref_audio=audio).param == "ref_sample_rate"
    assert err(ref_audio=audio, ref_sample_rate=16000, task_type="custom_voice").param == "task_type"
    def broken(pcm, sr):
        raise ValueError("encoder exploded")

    failing = Qwen3TTSRunner(model, codec, reference_encoder=broken)
    with pytest.raises(RequestError) as e:
        failing.add(SpeechRequest(request_id="b", text="Hi.", ref_audio=audio, ref_sample_rate=16000,
                                  ref_text="Hello."))
    assert e.value.param == "ref_audio" and "encoder exploded" in e.value.message
    no_encoder = Qwen3TTSRunner(model, codec)
    with pytest.raises(RequestError) as e:
        no_encoder.add(SpeechRequest(request_id="b", text="Hi.", ref_audio=audio, ref_sample_rate=16000,
                                     ref_text="Hello."))
    assert e.value.param == "ref_text"

    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="icl", text="Hi there.", ref_audio=audio, ref_sample_rate=16000,
                             ref_text="Hello.", sampling=SamplingParams(temperature=0, max_new_tokens=6)))
    drain(runner, sink)
    frames = log.frames["icl"]
    first = codec.seen[0]
    assert torch.equal(first[:, :4], ref_codes.t()), "the decoder is primed with the reference frames"
    out = np.concatenate(sink.audio_chunks["icl"])
    full = FakeCodec.offline(ref_codes.tolist() + frames)
    np.testing.assert_array_equal(out, full[4 * FakeCodec.samples_per_frame:])
    assert runner.info.voice_cloning and runner.info.voices == []


def test_empty_streamed_text_fails_that_request_only(cv_model):
    runner, _, _ = _runner(cv_model)
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="e", text="", text_complete=False))
    runner.add(SpeechRequest(request_id="ok", text="Hi there.", sampling=SamplingParams(max_new_tokens=3)))
    runner.feed_text("e", "   ")
    runner.end_input("e")
    drain(runner, sink)
    assert sink.errors["e"].param == "input" and "ok" in sink.done
    assert "e" not in runner.requests and sorted(runner.free_slots) == list(range(16))


def test_load_from_hf_repo_id_offline(cv_dir, tmp_path, monkeypatch):
    """A repo id resolves through huggingface_hub's cache (offline: nothing is downloaded)."""
    import shutil

    import huggingface_hub.constants as hf_constants

    snap = tmp_path / "hub" / "models--tiny-org--tiny-qwen3-tts" / "snapshots" / "abc123"
    shutil.copytree(cv_dir, snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    model = Qwen3TTSModel.from_pretrained("tiny-org/tiny-qwen3-tts")
    assert model.model_dir == snap and model.cfg.tts_model_type == "custom_voice"


def test_load_runner_from_directory(cv_dir):
    runner = load_runner(cv_dir)
    assert runner.codec is None  # no speech_tokenizer/ in this checkpoint
    assert runner.info.family == "qwen3_tts" and runner.info.sample_rate == 24000
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id="x", text="Hi.",
                             sampling=SamplingParams(temperature=0, max_new_tokens=3)))
    drain(runner, sink)
    assert sink.done["x"][0] in ("stop", "length")


def test_timing_log_counts_requests(cv_model, caplog):
    """With timing on: every request's wait for its prefill and for its first audio is recorded,
    and the periodic log line reports them (and the extra notes), then starts a new window."""
    runner, _, _ = _runner(cv_model, settings=Qwen3Settings(timing=True))
    timing = runner.timing
    assert timing is not None
    timing.notes.append(lambda: "decoder note")
    sink = RecordingSink()
    for r in _requests(3, SamplingParams(temperature=0.0)):
        runner.add(r)
    drain(runner, sink)
    assert len(sink.done) == 3
    assert len(timing.latency["admit"]) == 3 and len(timing.latency["first_audio"]) == 3
    # each request's prefill comes before its first audio, so the sorted waits compare pairwise too
    assert all(a < f for a, f in zip(sorted(timing.latency["admit"]), sorted(timing.latency["first_audio"]),
                                     strict=True))
    with caplog.at_level("WARNING"):
        timing._log()
    line = caplog.records[-1].getMessage()
    assert "admit p50" in line and "first_audio p50" in line and "(n 3)" in line and "decoder note" in line
    assert timing.latency == {"admit": [], "first_audio": []}


def test_timing_window_from_settings(cv_model, caplog):
    """`timing_steps` sets the log window: with 2, a line every second engine step, each over 2 steps."""
    runner, _, _ = _runner(cv_model, settings=Qwen3Settings(timing=True, timing_steps=2))
    assert runner.timing is not None and runner.timing.window == 2
    runner.add(_requests(1, SamplingParams(temperature=0.0))[0])
    sink = RecordingSink()
    steps = 0
    with caplog.at_level("WARNING"):
        while runner.has_work():
            runner.step(sink)
            steps += 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("qwen3 runner timing")]
    assert steps >= 4 and len(lines) == steps // 2
    assert all(line.startswith("qwen3 runner timing: 2 steps") for line in lines)


def test_environment_reaches_the_runner_through_the_registry(cv_dir, monkeypatch):
    """The engine core loads the model through the registry, which reads the STREAMVOX_QWEN3_* variables."""
    from streamvox.models.registry import load_runner as load_model

    monkeypatch.setenv("STREAMVOX_QWEN3_TIMING", "1")
    monkeypatch.setenv("STREAMVOX_QWEN3_TIMING_STEPS", "7")
    runner = load_model(str(cv_dir), device="cpu")
    assert runner.timing is not None and runner.timing.window == 7
    monkeypatch.setenv("STREAMVOX_QWEN3_TIMING", "0")
    assert load_model(str(cv_dir), device="cpu").timing is None

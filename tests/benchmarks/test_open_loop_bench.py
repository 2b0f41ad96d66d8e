"""The open-loop benchmark's logic: playback clock, audibility, percentiles, arrivals, rate selection, and the
request bodies it sends (which path of a Qwen3-TTS runner they take)."""

from __future__ import annotations

import json
import random

import msgspec
import numpy as np
import pytest

from benchmarks.open_loop_bench import (
    CORPUS,
    AudibleDetector,
    PlaybackClock,
    corpus_lengths,
    highest_sustained,
    length_cap,
    load_corpus,
    percentile,
    poisson_arrivals,
    request_body,
    summarize,
)
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.server.speech_params import parse_speech_settings
from streamvox.settings import MediaPolicy, Qwen3Settings
from tests.helpers.qwen3_harness import RecordingSink
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

RATE = 22050
SECOND = 2 * RATE  # bytes of s16le mono audio


def test_playback_starts_after_the_jitter_buffer_and_counts_late_chunks() -> None:
    p = PlaybackClock(RATE, jitter_s=0.1)
    p.add(0.5, 0)  # an empty chunk neither starts playback nor counts
    p.add(1.0, SECOND // 2)  # first audio: plays 1.1 to 1.6
    p.add(1.55, SECOND // 2)  # before playback ran out: plays on to 2.1
    p.add(2.3, SECOND // 4)  # 0.2 s after playback ran out: an underrun, resumes from 2.3
    p.add(2.6, SECOND // 4)  # 0.05 s late again
    assert p.underruns == 2
    assert p.stall == pytest.approx(0.25)
    assert p.until == pytest.approx(2.85)


def test_the_jitter_buffer_absorbs_a_small_gap_after_the_first_chunk() -> None:
    buffered, unbuffered = PlaybackClock(RATE, jitter_s=0.1), PlaybackClock(RATE, jitter_s=0.0)
    for p in (buffered, unbuffered):
        p.add(0.0, SECOND // 20)  # 50 ms of audio
        p.add(0.12, SECOND // 20)
    assert (buffered.underruns, buffered.stall) == (0, 0.0)
    assert unbuffered.underruns == 1 and unbuffered.stall == pytest.approx(0.07)


def _s16(*samples: int) -> bytes:
    return np.array(samples, dtype="<i2").tobytes()


def test_audible_means_above_minus_40_dbfs_even_across_a_split_sample() -> None:
    d = AudibleDetector()
    assert not d.feed(_s16(0, 327, -327, 100))  # |s| <= 0.01 full scale is silence
    loud = _s16(400)
    assert not d.feed(loud[:1])  # half a sample: nothing to judge yet
    assert d.feed(loud[1:])
    assert AudibleDetector().feed(_s16(-32768))  # full-scale negative must not wrap to silence


def test_percentile_is_an_observed_value_by_nearest_rank() -> None:
    values = list(range(100, 0, -1))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50, 95, 99)
    assert percentile([1.0, 9.0, 3.0, 7.0], 50) == 3.0
    assert (percentile([5, 4, 3, 2, 1], 50), percentile([5, 4, 3, 2, 1], 25)) == (3, 2)  # rank rounds up
    assert percentile(list(range(10)), 99) == 9  # few samples: p99 is the maximum
    assert percentile([], 95) is None


def test_poisson_arrivals_are_seeded_sorted_and_near_the_rate() -> None:
    times = poisson_arrivals(10, 100, random.Random("0:10"))
    assert times == poisson_arrivals(10, 100, random.Random("0:10"))
    assert times == sorted(times) and 0 < times[0] and times[-1] < 100
    assert abs(len(times) - 1000) < 4 * 1000**0.5
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert np.median(gaps) == pytest.approx(0.1 * np.log(2), rel=0.15)  # exponential, not evenly spaced


def _row(rate: float, p95: float | None = 50.0, underruns: int = 0, failed: int = 0) -> dict:
    return {"rate": rate, "ok": 10 - failed, "failed": failed, "underruns": underruns, "ttfa_ms_p95": p95}


def test_highest_sustained_rate_needs_success_no_underruns_and_p95_within_200_ms() -> None:
    rows = [_row(8, p95=200.0), _row(2), _row(16, underruns=1), _row(12, p95=200.5), _row(10, failed=1), _row(4)]
    assert highest_sustained(rows) == 8
    assert highest_sustained([_row(1, p95=250.0), _row(2, p95=None, failed=10)]) is None


def _result(done: float, ttfa: float | None = 0.05, underruns: int = 0) -> dict:
    ok = ttfa is not None
    return {"ok": ok, "error": None if ok else "timeout", "done": done, "ttfa": ttfa, "e2e": 0.5, "send_lag": 0.001,
            "audio_s": 4.0, "underruns": underruns, "stall": 0.1 * underruns}


def test_summary_excludes_failures_from_latency_and_spans_at_least_the_duration() -> None:
    results = [_result(1.0), _result(2.0, ttfa=0.3, underruns=2), _result(3.0, ttfa=None)]
    row = summarize(5, results, duration=10, window_start=0.0, cpu={"client": 0.1})
    assert (row["sent"], row["ok"], row["failed"], row["errors"]) == (3, 2, 1, {"timeout": 1})
    assert row["ttfa_ms_p95"] == pytest.approx(300)
    assert (row["underruns"], row["streams_with_underruns"], row["stall_ms"]) == (2, 1, pytest.approx(200))
    assert row["achieved_rps"] == pytest.approx(0.2) and row["audio_s_per_s"] == pytest.approx(0.8)
    late = summarize(5, [_result(20.0)], duration=10, window_start=0.0, cpu={})
    assert late["achieved_rps"] == pytest.approx(1 / 20)  # replies that drain after the window lower it


def test_the_committed_corpus_runs_from_short_replies_to_paragraphs() -> None:
    texts = load_corpus(CORPUS)
    lengths = corpus_lengths(texts)
    assert 100 <= lengths["texts"] <= 200 and len(set(texts)) == len(texts)
    assert lengths["words_min"] <= 5 and 60 <= lengths["words_max"] <= 100
    assert sum(lengths["buckets"].values()) == len(texts) and lengths["buckets"][">100"] == 0
    assert lengths["buckets"]["1-5"] >= 10 and lengths["buckets"]["61-100"] >= 10


def test_length_cap_is_frames_per_word_times_the_words_and_at_least_one() -> None:
    assert length_cap("Hello there, how are you today?", 5) == 30
    assert length_cap("one", 2.4) == 2
    assert length_cap("   ", 5) == 1


def test_a_greedy_and_a_default_body_both_take_the_fast_path(tmp_path) -> None:
    """The checkpoint's generation defaults sample, and sampled requests run on the CUDA-graph fast path too
    (`runtime/fast_sampling.py`): a GPU run of the benchmark measures it with or without --temperature 0."""
    model = Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice"))
    runner = Qwen3TTSRunner(model, None, max_batch=2, settings=Qwen3Settings(fast="1", ignore_eos=True))
    text = max(load_corpus(CORPUS), key=lambda t: len(t.split()))
    base = {"model": runner.info.name, "voice": runner.info.default_voice, "response_format": "pcm"}
    sink = RecordingSink()
    for rid, temperature in (("default", None), ("greedy", 0.0)):
        body = json.loads(request_body(base, text, 5, temperature))
        request = parse_speech_settings(body, runner.info, MediaPolicy())
        assert request.sampling.max_new_tokens == length_cap(text, 5) and request.sampling.temperature == temperature
        runner.add(msgspec.structs.replace(request, request_id=rid, text=body["input"]))
    runner.step(sink)
    assert not sink.errors
    assert (runner.requests["default"].fast, runner.requests["greedy"].fast) == (True, True)

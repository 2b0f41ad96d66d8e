"""The slot-state codec decoder (`codec/graphed.GraphedDecoder`), run eagerly on the CPU: the same
buckets, padding, slot gathers and scatters that its CUDA graphs capture, checked against the offline
decode of the tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
from streamvox.models.qwen3_tts.codec.graphed import GraphedDecoder, frame_buckets
from tests.helpers.qwen3_tiny_codec import TINY_DECODER_CONFIG, build_tiny_speech_tokenizer

SPF = 1920
TOL = 1e-4
CODEBOOK = TINY_DECODER_CONFIG["codebook_size"]


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Code2Wav:
    tok_dir = build_tiny_speech_tokenizer(tmp_path_factory.mktemp("qwen3_codec") / "speech_tokenizer")
    return Code2Wav.from_pretrained(tok_dir, device="cpu", dtype=torch.float32)


def _codes(seed: int, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK, (16, t), generator=g)


def test_frame_buckets() -> None:
    assert frame_buckets(25) == (1, 2, 4, 8, 12, 16, 20, 24, 25)
    assert frame_buckets(16) == (1, 2, 4, 8, 12, 16)
    assert frame_buckets(2) == (1, 2)
    assert frame_buckets(1) == (1,)


def test_streams_equal_offline_decode(codec: Code2Wav) -> None:
    """Six streams (more than `max_rows`) with uneven chunks, chunks longer than a lane's largest
    bucket, a stream joining late, and first chunks on lane 0: each equals its offline decode."""
    dec = GraphedDecoder(codec, slots=8, max_rows=4, lane_frames=(2, 6), use_graphs=False)
    lens = [23, 17, 30, 9, 14, 20]
    codes = [_codes(40 + i, n) for i, n in enumerate(lens)]
    plans = [[1, 5, 0, 9, 8], [2, 0, 0, 15], [1, 7, 15, 1, 6], [0, 0, 2, 7], [1, 13], [2, 3, 3, 12]]
    states: list = [None] * len(codes)
    pos = [0] * len(codes)
    outs: list[list[torch.Tensor]] = [[] for _ in codes]
    for r in range(max(len(p) for p in plans)):
        first, rest = [], []
        for i, plan in enumerate(plans):
            n = plan[r] if r < len(plan) else 0
            if n == 0:
                continue
            if states[i] is None:
                states[i] = dec.new_stream_state()
                first.append(i)
            else:
                rest.append(i)
        for lane, group in ((0, [i for i in first if plans[i][r] <= 2]),
                            (1, rest + [i for i in first if plans[i][r] > 2])):
            if not group:
                continue
            got = dec.decode_stream([codes[i][:, pos[i] : pos[i] + plans[i][r]] for i in group],
                                    [states[i] for i in group], lane=lane)
            for i, wav in zip(group, got, strict=True):
                assert wav.shape == (plans[i][r] * SPF,)
                outs[i].append(wav.clone())
                pos[i] += plans[i][r]
    assert pos == lens
    assert len({s.slot for s in states}) == len(states)
    for c, o in zip(codes, outs, strict=True):
        ref = codec.decode(c[None])[0]
        assert (torch.cat(o) - ref).abs().max().item() <= TOL


def test_calls_split_by_chunk_size(codec: Code2Wav) -> None:
    """Chunks of very different sizes due together go to separate calls (a 1-frame chunk is not padded to
    25 frames), equal sizes share one; every row is decoded once, and `usage` counts real and padded frames."""
    dec = GraphedDecoder(codec, slots=10, max_rows=16, lane_frames=(25,), use_graphs=False)
    assert dec._partition([25, 1, 25, 1, 25, 1, 25, 1], dec.lanes[0].frame_buckets) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dec._partition([25, 24, 25], dec.lanes[0].frame_buckets) == [[0, 2, 1]]
    lens = [9, 1, 9, 1, 16, 2]
    states = [dec.new_stream_state() for _ in lens]
    codes = [_codes(60 + i, n) for i, n in enumerate(lens)]
    got = dec.decode_stream(codes, states)
    for c, wav in zip(codes, got, strict=True):
        assert (wav - codec.decode(c[None])[0]).abs().max().item() <= TOL
    usage = dec.usage()
    calls = int(usage.split(": ")[1].split(" calls")[0])
    assert calls >= 2 and f"{sum(lens)} frames" in usage
    assert "0 calls, 0 frames" in dec.usage()  # reading resets the counters


def test_released_slot_starts_fresh(codec: Code2Wav) -> None:
    """A slot given back and taken by a new stream carries nothing of the old one."""
    dec = GraphedDecoder(codec, slots=1, max_rows=2, lane_frames=(4,), use_graphs=False)
    old = dec.new_stream_state()
    dec.decode_stream([_codes(1, 7)], [old])
    dec.release_stream(old)
    new = dec.new_stream_state()
    assert new.slot == old.slot
    a = _codes(2, 10)
    got = torch.cat([dec.decode_stream([a[:, :3]], [new])[0], dec.decode_stream([a[:, 3:]], [new])[0]])
    assert (got - codec.decode(a[None])[0]).abs().max().item() <= TOL


def test_zero_frame_rows(codec: Code2Wav) -> None:
    dec = GraphedDecoder(codec, slots=2, max_rows=2, lane_frames=(4,), use_graphs=False)
    s1, s2 = dec.new_stream_state(), dec.new_stream_state()
    got = dec.decode_stream([_codes(3, 0), _codes(4, 2)], [s1, s2])
    assert got[0].shape == (0,) and got[1].shape == (2 * SPF,)
    assert s1.frames == 0 and s2.frames == 2


def test_runner_audio_is_the_same_with_slot_decoder(tmp_path) -> None:
    """Through the runner (several concurrent requests, the chunk ramp, ends at different frames):
    the slot decoder gives the same audio as `Code2Wav.decode_stream`, and frees every slot."""
    import numpy as np

    from streamvox.contract import SamplingParams, SpeechRequest
    from streamvox.models.qwen3_tts.runtime.loader import load_runner
    from streamvox.settings import Qwen3Settings
    from tests.helpers.qwen3_harness import RecordingSink, drain
    from tests.helpers.qwen3_tiny import build_tiny_checkpoint

    path = build_tiny_checkpoint(tmp_path / "ckpt", "custom_voice", codebook_size=CODEBOOK,
                                 speech_tokenizer_builder=lambda d: build_tiny_speech_tokenizer(d, seed=3))
    texts = ["Hello world, this is a test.", "Streaming text arrives.", "The quick brown fox jumps."]
    audio = {}
    for mode in ("0", "1"):
        runner = load_runner(path, max_batch=4, codec_chunk_frames=6, settings=Qwen3Settings(codec_graphs=mode))
        assert isinstance(runner.codec, GraphedDecoder) == (mode == "1")
        sink = RecordingSink()
        for i, text in enumerate(texts):
            runner.add(SpeechRequest(request_id=f"r{i}", text=text, voice="alice", language="english",
                                     sampling=SamplingParams(temperature=0.0, max_new_tokens=9 + 7 * i)))
            runner.step(sink)
        drain(runner, sink)
        assert not sink.errors and len(sink.done) == len(texts)
        audio[mode] = {rid: np.concatenate(c) for rid, c in sink.audio_chunks.items()}
        if mode == "1":
            assert sorted(runner.codec.free) == list(range(8))
    assert audio["0"].keys() == audio["1"].keys() == {"r0", "r1", "r2"}
    for rid, pcm in audio["0"].items():
        assert pcm.shape == audio["1"][rid].shape and pcm.size > 0
        assert np.abs(pcm - audio["1"][rid]).max() <= TOL

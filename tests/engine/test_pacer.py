"""The engine core's audio pacing: first delta at once, later audio merged, nothing lost or reordered."""

from __future__ import annotations

import numpy as np

from streamvox.engine.pacer import Pacer

RATE = 1000  # samples per second, to keep the arithmetic readable


def _chunk(start: int, size: int = 50) -> np.ndarray:
    return np.arange(start, start + size, dtype=np.float32)


def test_first_delta_is_immediate_and_later_audio_is_merged_until_due():
    pacer = Pacer(RATE, headroom_s=0.5, max_delta_s=1.0, min_interval_s=0.02)
    out: list = []
    pacer.add("a", _chunk(0), 0.0, out)
    assert [(rid, len(pcm)) for rid, pcm in out] == [("a", 50)]
    out.clear()
    for i in range(1, 5):  # produced much faster than real time, within 10 ms
        pacer.add("a", _chunk(50 * i), 0.0025 * i, out)
        pacer.flush_due(0.0025 * i, out)
    assert out == []  # held: not yet min_interval_s since the last delta
    assert 0 < pacer.timeout_s(0.01) <= 0.01
    pacer.flush_due(0.02, out)
    assert len(out) == 1 and np.array_equal(out[0][1], np.arange(50, 250, dtype=np.float32))


def test_audio_is_held_while_the_client_has_headroom_but_never_past_max_delta():
    pacer = Pacer(RATE, headroom_s=0.5, max_delta_s=1.0, min_interval_s=0.02)
    out: list = []
    pacer.add("a", _chunk(0, 2000), 0.0, out)  # 2 s of audio ahead of playback
    pacer.add("a", _chunk(2000, 500), 0.1, out)
    pacer.flush_due(1.0, out)
    assert len(out) == 1  # the client still has 1 s: the new 0.5 s waits
    pacer.flush_due(1.6, out)  # 0.4 s left: below the headroom
    assert len(out) == 2 and len(out[1][1]) == 500
    pacer.add("a", _chunk(2500, 1200), 1.7, out)  # more than max_delta_s at once: sent now
    assert len(out) == 3 and len(out[2][1]) == 1200


def test_end_flushes_held_audio_and_cancel_drops_it():
    pacer = Pacer(RATE)
    out: list = []
    for rid in ("a", "b"):
        pacer.add(rid, _chunk(0), 0.0, out)
        pacer.add(rid, _chunk(50), 0.001, out)
    pacer.end("a", 0.002, out)
    pacer.drop("b")
    pacer.flush_due(10.0, out)
    assert [(rid, len(pcm)) for rid, pcm in out] == [("a", 50), ("b", 50), ("a", 50)]
    audio = np.concatenate([pcm for rid, pcm in out if rid == "a"])
    assert np.array_equal(audio, np.arange(100, dtype=np.float32))

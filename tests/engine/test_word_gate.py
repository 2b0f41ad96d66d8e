"""`WordGate`: word timings leave the core after the audio they cover, never before, never holding audio."""

from __future__ import annotations

from streamvox.contract import WordTimings
from streamvox.engine.word_gate import WordGate


def _timings(*spans: tuple[float, float]) -> WordTimings:
    n = len(spans)
    return WordTimings([f"w{i}" for i in range(n)], [s for s, _ in spans], [e for _, e in spans],
                       list(range(0, 2 * n, 2)), list(range(1, 2 * n, 2)))


def test_timings_wait_for_the_audio_they_cover():
    gate, out = WordGate(), []
    gate.open("r", 1000)
    gate.add("r", _timings((0.0, 0.5), (0.5, 1.0), (1.2, 1.6)))
    gate.take_due(out)
    assert out == []  # no audio has left yet
    gate.sent("r", 500)
    gate.take_due(out)
    assert [t.words for _, t in out] == [["w0"]]
    gate.sent("r", 600)  # 1.1 s
    gate.take_due(out)
    assert [t.words for _, t in out] == [["w0"], ["w1"]]
    gate.add("r", _timings((1.6, 2.0)))
    gate.sent("r", 2000)
    gate.take_due(out)
    assert [w for _, t in out for w in t.words] == ["w0", "w1", "w2", "w0"]
    assert not gate.waiting


def test_an_ended_request_sends_the_rest_and_a_failed_or_cancelled_one_drops_it():
    gate = WordGate()
    for request_id in ("ok", "failed"):
        gate.open(request_id, 1000)
        gate.add(request_id, _timings((0.0, 3.0)))
    out = []
    gate.sent("ok", 2500)
    gate.close("ok", out)
    gate.close("failed", None)
    assert [(r, t.words, t.end) for r, t in out] == [("ok", ["w0"], [2.5])]  # within the audio sent
    gate.add("failed", _timings((0.0, 1.0)))  # after its end: ignored
    assert not gate.waiting


def test_requests_that_did_not_ask_get_nothing_and_stretched_time_is_scaled():
    gate, out = WordGate(), []
    gate.add("other", _timings((0.0, 0.1)))
    gate.sent("other", 10_000)
    gate.open("slow", 1000, time_scale=2.0)  # e.g. speed 0.5 stretched by the core
    gate.add("slow", _timings((0.0, 0.5), (0.5, 1.0)))
    gate.sent("slow", 1000)
    gate.take_due(out)
    assert [(r, t.start, t.end) for r, t in out] == [("slow", [0.0], [1.0])]

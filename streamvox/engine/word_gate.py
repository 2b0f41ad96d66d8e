"""When each request's word timings leave the engine core: right after the audio they cover.

The pacer may hold a request's audio back, and a resampler holds back a little
of it too, so a runner's `words()` call can come before the audio it covers has
left the core. The gate holds the timings until the request's audio that has
left reaches each word's end; timings never wait for anything else, and audio
never waits for timings. A request that finishes sends its remaining timings
with its last audio, before its end.
"""

from __future__ import annotations

from streamvox.contract import WordTimings

_EPSILON_S = 1e-6  # a word ending on the last sample sent counts as covered


class _Gated:
    __slots__ = ("rate", "time_scale", "sent", "pending")

    def __init__(self, rate: int, time_scale: float) -> None:
        self.rate = rate  # of the audio counted in `sent`
        self.time_scale = time_scale
        self.sent = 0  # samples that have left the core
        self.pending: list[WordTimings] = []


class WordGate:
    """Holds the word timings of the requests that asked for them until their audio has left the core."""

    def __init__(self) -> None:
        self._requests: dict[str, _Gated] = {}
        self.waiting: set[str] = set()  # requests with pending timings

    def open(self, request_id: str, sample_rate: int, time_scale: float = 1.0) -> None:
        """Track a request whose audio leaves at `sample_rate`.

        `time_scale`: output seconds per second of the runner's audio, where the core stretches the
        request's time axis (timings are in seconds, so resampling needs no scale).
        """
        self._requests[request_id] = _Gated(sample_rate, time_scale)

    def add(self, request_id: str, timings: WordTimings) -> None:
        gated = self._requests.get(request_id)
        if gated is not None and len(timings):
            if gated.time_scale != 1.0:
                timings = timings.shifted(time_scale=gated.time_scale)
            gated.pending.append(timings)
            self.waiting.add(request_id)

    def sent(self, request_id: str, samples: int) -> None:
        """`samples` more of the request's audio left the core."""
        gated = self._requests.get(request_id)
        if gated is not None:
            gated.sent += samples

    def take_due(self, out: list[tuple[str, WordTimings]]) -> None:
        """Append to `out` the pending timings whose audio has left; each request's in order."""
        for request_id in list(self.waiting):
            gated = self._requests[request_id]
            heard = gated.sent / gated.rate + _EPSILON_S
            while gated.pending:
                first = gated.pending[0]
                covered = sum(1 for end in first.end if end <= heard)  # ends are in order
                if covered == len(first):
                    out.append((request_id, gated.pending.pop(0)))
                    continue
                if covered:
                    out.append((request_id, first.slice(0, covered)))
                    gated.pending[0] = first.slice(covered)
                break
            if not gated.pending:
                self.waiting.discard(request_id)

    def close(self, request_id: str, out: list[tuple[str, WordTimings]] | None) -> None:
        """The request ended: its pending timings go to `out` (its last audio has left), or are dropped (None).

        Times past the end of the audio sent (a stretched request's audio can come out a little shorter
        than its scaled times) are moved to that end: timings lie within the audio.
        """
        gated = self._requests.pop(request_id, None)
        self.waiting.discard(request_id)
        if gated is None or out is None:
            return
        duration = gated.sent / gated.rate
        for timings in gated.pending:
            if timings.end[-1] > duration:
                timings = WordTimings(timings.words, [min(t, duration) for t in timings.start],
                                      [min(t, duration) for t in timings.end], timings.char_start, timings.char_end)
            out.append((request_id, timings))

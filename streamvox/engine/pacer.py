"""When each request's audio leaves the engine core: first packet at once, later audio merged.

Under load the front end then handles a few large deltas per request instead
of one per model buffer, while every client keeps enough audio ahead of its
playback. Pacing never reorders, drops or splits samples.
"""

from __future__ import annotations

import math

import numpy as np


class _Paced:
    """One request's outgoing audio: what was sent (for the client's playback clock) and what waits."""

    __slots__ = ("first_at", "last_at", "sent", "parts", "pending", "deadline")

    def __init__(self) -> None:
        self.first_at = 0.0
        self.last_at = 0.0
        self.sent = 0  # samples
        self.parts: list[np.ndarray] = []
        self.pending = 0  # samples
        self.deadline = math.inf


class Pacer:
    """Decides when each request's audio leaves the core; never reorders or splits samples.

    A request's first audio is sent at once (time to first packet). After that its
    audio waits while the client has more than `headroom_s` of audio ahead of real-time
    playback of what it has received, but never past `max_delta_s` of audio, and
    deltas are at least `min_interval_s` apart, a floor that grows with the number of
    active requests (at most about `max_deltas_per_s` deltas in all). A request's
    remaining audio leaves with its end. Concatenated deltas are identical whatever the timing.
    """

    def __init__(self, sample_rate: int, *, headroom_s: float = 0.5, max_delta_s: float = 1.0,
                 min_interval_s: float = 0.02, max_deltas_per_s: float = 2000.0) -> None:
        self.rate = sample_rate
        self.headroom_s = headroom_s
        self.max_samples = int(max_delta_s * sample_rate)
        self.min_interval_s = min_interval_s
        self.max_deltas_per_s = max_deltas_per_s
        self._streams: dict[str, _Paced] = {}
        self._next_deadline = math.inf

    def add(self, request_id: str, pcm: np.ndarray, now: float, out: list[tuple[str, np.ndarray]]) -> bool:
        """Queue a request's new audio; True when it is the request's first (appended to `out` at once)."""
        if not len(pcm):
            return False
        paced = self._streams.get(request_id)
        if paced is None:  # the first audio of the request: send at once
            paced = self._streams[request_id] = _Paced()
            paced.first_at = paced.last_at = now
            paced.sent = len(pcm)
            out.append((request_id, pcm))
            return True
        paced.parts.append(pcm)
        paced.pending += len(pcm)
        if paced.pending >= self.max_samples:
            self._emit(request_id, paced, now, out)
        else:
            paced.deadline = self._deadline(paced)
            self._next_deadline = min(self._next_deadline, paced.deadline)
        return False

    def _interval(self) -> float:
        return max(self.min_interval_s, len(self._streams) / self.max_deltas_per_s)

    def _deadline(self, paced: _Paced) -> float:
        playback_low = paced.first_at + paced.sent / self.rate - self.headroom_s
        return max(paced.last_at + self._interval(), playback_low)

    def _emit(self, request_id: str, paced: _Paced, now: float, out: list[tuple[str, np.ndarray]]) -> None:
        pcm = paced.parts[0] if len(paced.parts) == 1 else np.concatenate(paced.parts)
        out.append((request_id, pcm))
        paced.sent += paced.pending
        paced.parts = []
        paced.pending = 0
        paced.last_at = now
        paced.deadline = math.inf

    def flush_due(self, now: float, out: list[tuple[str, np.ndarray]]) -> None:
        """Send the audio whose time has come."""
        if now < self._next_deadline:
            return
        next_deadline = math.inf
        for request_id, paced in self._streams.items():
            if paced.pending:
                if paced.deadline <= now:
                    self._emit(request_id, paced, now, out)
                else:
                    next_deadline = min(next_deadline, paced.deadline)
        self._next_deadline = next_deadline

    def end(self, request_id: str, now: float, out: list[tuple[str, np.ndarray]]) -> None:
        """The request finished or failed: its held audio goes now, and its state is dropped."""
        paced = self._streams.pop(request_id, None)
        if paced is not None and paced.pending:
            self._emit(request_id, paced, now, out)

    def drop(self, request_id: str) -> None:
        """The request was cancelled: its held audio is discarded."""
        self._streams.pop(request_id, None)

    def restart(self, request_id: str) -> None:
        """Nothing the request was sent reached its client: its next audio counts as its first (sent at once)."""
        paced = self._streams.get(request_id)
        if paced is not None and not paced.pending:
            del self._streams[request_id]

    def timeout_s(self, now: float) -> float:
        """How long the core may sleep before some held audio is due."""
        return max(0.0, self._next_deadline - now)

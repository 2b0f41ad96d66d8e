"""Server-side voice activity detection for `turn_detection: {"type": "server_vad"}`.

An energy detector over 20 ms frames of the session's input audio (PCM16 at any rate): a frame is speech when
its RMS level (0..1 of full scale) is above a level derived from `threshold` (upstream's 0..1 knob, default
0.5). Speech starts after `START_FRAMES` speech frames in a row and stops after `silence_duration_ms` of
non-speech. Positions are milliseconds of audio appended since the buffer was last committed or cleared, as
upstream reports them in `speech_started.audio_start_ms` / `speech_stopped.audio_end_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_MS = 20
START_FRAMES = 3  # 60 ms of speech before speech_started


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    @classmethod
    def from_turn_detection(cls, config: dict) -> VadSettings:
        """Upstream's turn_detection object -> settings; ValueError names a bad field."""
        values = {}
        for key, kind in (("threshold", float), ("prefix_padding_ms", int), ("silence_duration_ms", int),
                          ("create_response", bool), ("interrupt_response", bool)):
            value = config.get(key)
            if value is None:
                continue
            if kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"'{key}' must be true or false")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e7 \
                    or (key == "threshold" and value > 1):
                raise ValueError(f"'{key}' must be a number in range" + (" 0..1" if key == "threshold" else ""))
            values[key] = kind(value)
        return cls(**values)

    @property
    def rms_level(self) -> float:
        # threshold 0.5 -> RMS 0.01 (-40 dBFS); 0 -> 0.001, 1 -> 0.1: a log scale over 40 dB.
        return float(10 ** (-3 + 2 * min(max(self.threshold, 0.0), 1.0)))


@dataclass
class VadEvent:
    kind: str  # "speech_started" | "speech_stopped"
    ms: int


class EnergyVad:
    def __init__(self, settings: VadSettings, sample_rate: int) -> None:
        self.settings = settings
        self.sample_rate = sample_rate
        self.frame = sample_rate * FRAME_MS // 1000
        self.pending = np.zeros(0, dtype=np.float32)
        self.position_ms = 0
        self.speaking = False
        self.run = 0  # consecutive speech frames (while silent) or silent frames (while speaking)

    def reset(self) -> None:
        self.pending = np.zeros(0, dtype=np.float32)
        self.position_ms = 0
        self.speaking = False
        self.run = 0

    def process(self, pcm16: bytes) -> list[VadEvent]:
        samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        data = np.concatenate([self.pending, samples]) if len(self.pending) else samples
        events = []
        whole = len(data) // self.frame * self.frame
        frames = data[:whole].reshape(-1, self.frame) if whole else np.zeros((0, self.frame), np.float32)
        self.pending = data[whole:].copy()
        level = self.settings.rms_level
        silence_frames = max(1, self.settings.silence_duration_ms // FRAME_MS)
        for rms in np.sqrt(np.mean(frames * frames, axis=1)) if len(frames) else []:
            self.position_ms += FRAME_MS
            voiced = rms > level
            if not self.speaking:
                self.run = self.run + 1 if voiced else 0
                if self.run >= START_FRAMES:
                    self.speaking, self.run = True, 0
                    start = self.position_ms - START_FRAMES * FRAME_MS
                    events.append(VadEvent("speech_started", max(0, start)))
            else:
                self.run = 0 if voiced else self.run + 1
                if self.run >= silence_frames:
                    self.speaking, self.run = False, 0
                    events.append(VadEvent("speech_stopped", self.position_ms - silence_frames * FRAME_MS))
        return events

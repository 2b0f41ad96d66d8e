"""Server-side voice activity detection for `turn_detection: {"type": "server_vad"}`: Silero VAD.

Silero VAD gives the probability that a 32 ms window of audio is speech (512 samples at 16 kHz, 256 at 8 kHz;
other input rates are resampled to 16 kHz). Its ONNX model ships inside the `silero-vad` wheel and runs
through onnxruntime (nothing is downloaded); one model serves every session, each session keeps its own
recurrent state. onnxruntime was measured against the wheel's TorchScript model: about 0.12 ms of CPU per
window against 0.35 ms, and no torch import in the server process (benchmarks/vad_bench.py --runtimes).

The `turn_detection` fields keep upstream's meaning:
- `threshold` (0..1, default 0.5): a window whose speech probability is at least this is speech, and speech
  starts with the first one; below `threshold - 0.15` a window is silence (in between, nothing changes:
  hysteresis, as in Silero's own `VADIterator`). Stationary noise (white, pink, brown, up to 10 dB louder than
  speech) stays below 0.15.
- `speech_started.audio_start_ms` is where the speech began minus `prefix_padding_ms`: the start of the audio
  that becomes the user's turn.
- speech stops after `silence_duration_ms` of silence; `speech_stopped.audio_end_ms` is where the speech ended
  plus `silence_duration_ms`: the end of the turn's audio, where the stop was detected.
Silero's probability crosses the threshold about one window after the speech begins and falls below the silence
level about two windows after it ends, so the begin and end positions are corrected by `ONSET_LEAD_MS` and
`OFFSET_LAG_MS` (measured on espeak speech alone and with white, pink and brown noise 30 and 10 dB below it:
mean errors of +3 and -6 ms, all within -53..+79 and -96..+111 ms). Positions are milliseconds of input audio
since the detector's origin (the start of the session's input audio).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import metadata

import numpy as np

from streamvox.audio.resample import Resampler

MODEL_FILE = "silero_vad/data/silero_vad.onnx"  # in the silero-vad wheel
WINDOW_MS = 32
HYSTERESIS = 0.15
ONSET_LEAD_MS = 32
OFFSET_LAG_MS = 64


class VadConfigError(ValueError):
    """A `turn_detection` field is invalid; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    @classmethod
    def from_turn_detection(cls, config: dict) -> VadSettings:
        """Upstream's turn_detection object -> settings; `VadConfigError` names a bad field."""
        values = {}
        for key, kind in (("threshold", float), ("prefix_padding_ms", int), ("silence_duration_ms", int),
                          ("create_response", bool), ("interrupt_response", bool)):
            value = config.get(key)
            if value is None:
                continue
            if kind is bool:
                if not isinstance(value, bool):
                    raise VadConfigError(key, "must be true or false")
            elif key == "threshold":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise VadConfigError(key, "must be a number from 0 to 1")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10_000_000 \
                    or value != int(value):
                raise VadConfigError(key, "must be a whole number of milliseconds from 0 to 10000000")
            values[key] = kind(value)
        return cls(**values)


@dataclass
class VadEvent:
    kind: str  # "speech_started" | "speech_stopped"
    ms: int  # audio_start_ms / audio_end_ms, as upstream reports them (see the module docstring)


class SileroModel:
    """The Silero VAD network, loaded once per process and shared by every session (each keeps its own state)."""

    _shared: SileroModel | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one 32 ms window is too small to split; sessions run side by side
        options.inter_op_num_threads = 1
        path = metadata.distribution("silero-vad").locate_file(MODEL_FILE)
        self.session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])

    @classmethod
    def loaded(cls) -> bool:
        return cls._shared is not None

    @classmethod
    def shared(cls) -> SileroModel:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def probability(self, window: np.ndarray, state: np.ndarray, rate: int) -> tuple[float, np.ndarray]:
        """Speech probability of one window (with its context samples in front); the new recurrent state."""
        out, state = self.session.run(None, {"input": window[None, :], "state": state,
                                             "sr": np.array(rate, dtype=np.int64)})
        return float(out[0, 0]), state


class SileroVad:
    """One session's detector: feed it the input audio in order, it returns the speech starts and stops."""

    def __init__(self, settings: VadSettings, sample_rate: int, origin_ms: int = 0) -> None:
        self.settings = settings
        self.sample_rate = sample_rate
        self.origin_ms = origin_ms  # the position of the first sample fed
        self.rate = 8000 if sample_rate == 8000 else 16000
        self.window = 256 if self.rate == 8000 else 512
        self.context = 32 if self.rate == 8000 else 64
        self.resampler = Resampler(sample_rate, self.rate)
        self.epoch = 0  # that of the audio heard last (see `hear`)
        self.pending = np.zeros(self.context, dtype=np.float32)  # context samples, then the next window's
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.windows = 0  # windows run so far
        self.forget_speech()

    def forget_speech(self) -> None:
        """Hear what follows as if no speech had started (the input buffer was cleared)."""
        self.speaking = False
        self.silence_start: int | None = None  # the first window of the silence heard since the speech

    def _window_ms(self, index: int) -> int:
        return self.origin_ms + index * WINDOW_MS

    def process(self, samples: np.ndarray) -> list[VadEvent]:
        """Float32 samples at `sample_rate` -> the events they complete."""
        model = SileroModel.shared()
        data = np.concatenate([self.pending, self.resampler.process(samples)])
        events: list[VadEvent] = []
        s = self.settings
        silence_threshold = max(s.threshold - HYSTERESIS, 0.01)
        start = 0
        while start + self.context + self.window <= len(data):
            window = data[start:start + self.context + self.window]
            p, self.state = model.probability(window, self.state, self.rate)
            index = self.windows
            self.windows += 1
            start += self.window
            if not self.speaking:
                if p >= s.threshold:
                    self.speaking, self.silence_start = True, None
                    onset = self._window_ms(index) - ONSET_LEAD_MS
                    events.append(VadEvent("speech_started", max(self.origin_ms, onset - s.prefix_padding_ms)))
            elif p >= s.threshold:
                self.silence_start = None
            else:
                if self.silence_start is None and p < silence_threshold:
                    self.silence_start = index
                if self.silence_start is not None and \
                        (self.windows - self.silence_start) * WINDOW_MS >= s.silence_duration_ms:
                    self.speaking = False
                    end = max(self.origin_ms, self._window_ms(self.silence_start) - OFFSET_LAG_MS)
                    events.append(VadEvent("speech_stopped", end + s.silence_duration_ms))
                    self.silence_start = None
        self.pending = data[start:].copy()
        return events


def hear(segments: list[tuple[int, SileroVad, np.ndarray]]) -> list[tuple[int, VadEvent]]:
    """Run each (epoch, detector, samples) segment through its detector, in order; the events, each with the epoch
    of the audio it was heard in. A segment of a newer epoch than its detector's last (the input buffer was
    cleared in between) starts with the speech forgotten."""
    events = []
    for epoch, vad, samples in segments:
        if epoch != vad.epoch:
            vad.epoch = epoch
            vad.forget_speech()
        events += [(epoch, event) for event in vad.process(samples)]
    return events

"""Server VAD (Silero) on espeak speech with silences, alone and under background noise.

The truth comes from the layout the test builds: each clip's speech is where its 10 ms frames are above -45 dBFS
(espeak's own leading and trailing silence is not speech), placed after a known silence. "Noise at -30 dB and
-10 dB" is noise 30 and 10 dB below the speech's level (SNR +30 and +10 dB): white, pink and brown, seeded.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from streamvox.agent.vad import SileroVad, VadConfigError, VadSettings
from streamvox.audio.resample import Resampler

RATE = 24000
TOLERANCE_MS = 100
TEXTS = ["Hello there, how are you today?", "The train to the coast leaves at nine, so pack light and bring a coat.",
         "Stop, stop.", "What is the weather like in Paris this weekend?"]
GAPS_S = [0.8, 1.2, 1.0, 1.4]
TAIL_S = 1.5


def speech(server, text: str) -> np.ndarray:
    response = httpx.post(f"{server.url}/v1/audio/speech", timeout=60,
                          json={"input": text, "response_format": "pcm", "sample_rate": RATE})
    response.raise_for_status()
    return np.frombuffer(response.content, "<i2").astype(np.float32) / 32768


def speech_span_ms(clip: np.ndarray) -> tuple[int, int]:
    """Where a clip's speech starts and ends: its first and last 10 ms frame above -45 dBFS."""
    frame = RATE // 100
    frames = clip[:len(clip) // frame * frame].reshape(-1, frame)
    loud = np.flatnonzero(np.sqrt(np.mean(frames ** 2, axis=1)) > 10 ** (-45 / 20))
    return int(loud[0]) * 10, (int(loud[-1]) + 1) * 10


def noise(kind: str, n: int, seed: int) -> np.ndarray:
    """Unit-RMS noise: white, pink (1/f power) or brown (1/f^2)."""
    white = np.random.default_rng(seed).standard_normal(n)
    if kind != "white":
        spectrum = np.fft.rfft(white)
        f = np.maximum(np.arange(len(spectrum)), 1)
        white = np.fft.irfft(spectrum / (np.sqrt(f) if kind == "pink" else f), n)
    return (white / np.sqrt(np.mean(white ** 2))).astype(np.float32)


@pytest.fixture(scope="module")
def layout(espeak_server) -> tuple[np.ndarray, list[tuple[int, int]], float]:
    """(speech with silences, the truth: each utterance's (start, end) in ms, the speech's RMS level)."""
    clips = [speech(espeak_server, text) for text in TEXTS]
    parts, truth, position = [], [], 0
    for gap, clip in zip(GAPS_S, clips, strict=True):
        parts.append(np.zeros(int(gap * RATE), np.float32))
        position += int(gap * RATE)
        start, end = speech_span_ms(clip)
        truth.append((position * 1000 // RATE + start, position * 1000 // RATE + end))
        parts.append(clip)
        position += len(clip)
    parts.append(np.zeros(int(TAIL_S * RATE), np.float32))
    level = float(np.sqrt(np.mean(np.concatenate(clips) ** 2)))
    return np.concatenate(parts), truth, level


def events_of(samples: np.ndarray, settings: VadSettings, rate: int = RATE, chunk_ms: int = 20) -> list:
    vad = SileroVad(settings, rate)
    step = rate * chunk_ms // 1000
    events = []
    for start in range(0, len(samples), step):
        events += vad.process(samples[start:start + step])
    return events


def check_against_truth(events: list, truth: list[tuple[int, int]], settings: VadSettings) -> list[tuple]:
    """Each utterance is one speech_started / speech_stopped pair within TOLERANCE_MS of the truth; the errors."""
    kinds = [e.kind for e in events]
    assert kinds == ["speech_started", "speech_stopped"] * len(truth), [(e.kind, e.ms) for e in events]
    errors = []
    for (start, end), began, stopped in zip(truth, events[::2], events[1::2], strict=True):
        # audio_start_ms includes the prefix padding, audio_end_ms the silence that ended the turn
        start_error = began.ms + settings.prefix_padding_ms - start
        end_error = stopped.ms - settings.silence_duration_ms - end
        errors.append((start_error, end_error))
    assert all(abs(a) <= TOLERANCE_MS and abs(b) <= TOLERANCE_MS for a, b in errors), (errors, truth)
    return errors


@pytest.mark.parametrize("kind,below_db", [("clean", None)] + [
    (kind, below_db) for kind in ("white", "pink", "brown") for below_db in (30, 10)])
def test_speech_starts_and_stops_within_100_ms_of_the_truth(layout, kind, below_db):
    samples, truth, level = layout
    if below_db is not None:
        samples = samples + noise(kind, len(samples), seed=below_db) * level * 10 ** (-below_db / 20)
    for settings in (VadSettings(), VadSettings(prefix_padding_ms=0, silence_duration_ms=700)):
        errors = check_against_truth(events_of(samples, settings), truth, settings)
        print(kind, below_db, settings.prefix_padding_ms, settings.silence_duration_ms, "errors (ms):", errors)


@pytest.mark.parametrize("kind", ["white", "pink", "brown"])
def test_noise_alone_never_starts_a_turn(layout, kind):
    _, _, level = layout
    for below_db in (30, 10, 0):  # up to as loud as the speech
        assert events_of(noise(kind, 10 * RATE, seed=7) * level * 10 ** (-below_db / 20), VadSettings()) == []


def test_other_input_rates(layout):
    """8 kHz (G.711) runs Silero's 8 kHz model; 16 kHz feeds it directly; other rates are resampled to 16 kHz."""
    samples, truth, _ = layout
    settings = VadSettings()
    for rate in (8000, 16000, 44100, 48000):
        resampler = Resampler(RATE, rate)
        resampled = np.concatenate([resampler.process(samples), resampler.flush()])
        check_against_truth(events_of(resampled, settings, rate), truth, settings)


def test_silence_duration_decides_whether_a_pause_ends_the_turn(espeak_server):
    clip = speech(espeak_server, "One more thing.")
    start, end = speech_span_ms(clip)
    clip = clip[start * RATE // 1000:end * RATE // 1000]  # speech only: the pause is exactly 350 ms
    pause = np.zeros(int(0.35 * RATE), np.float32)
    samples = np.concatenate([np.zeros(RATE // 2, np.float32), clip, pause, clip, np.zeros(RATE, np.float32)])
    assert [e.kind for e in events_of(samples, VadSettings(silence_duration_ms=600))] == [
        "speech_started", "speech_stopped"]
    assert [e.kind for e in events_of(samples, VadSettings(silence_duration_ms=150))] == [
        "speech_started", "speech_stopped"] * 2


def test_threshold_is_the_speech_probability(layout):
    samples, truth, level = layout
    noisy = samples + noise("pink", len(samples), seed=3) * level * 10 ** (-10 / 20)
    # at 1.0 nothing is sure enough to be speech; lower thresholds hear every utterance
    assert events_of(noisy, VadSettings(threshold=1.0)) == []
    for threshold in (0.3, 0.5, 0.8):
        assert len(events_of(noisy, VadSettings(threshold=threshold))) == 2 * len(truth)


def test_chunking_does_not_change_the_events(layout):
    samples, _, _ = layout
    settings = VadSettings()
    reference = [(e.kind, e.ms) for e in events_of(samples, settings, chunk_ms=20)]
    for chunk_ms in (7, 100, 1000):
        assert [(e.kind, e.ms) for e in events_of(samples, settings, chunk_ms=chunk_ms)] == reference


def test_positions_count_from_the_origin_and_speech_can_be_forgotten(layout):
    samples, truth, _ = layout
    settings = VadSettings(prefix_padding_ms=0)
    vad = SileroVad(settings, RATE, origin_ms=60_000)
    first = vad.process(samples[:int((truth[0][0] + 500) * RATE / 1000)])
    assert [e.kind for e in first] == ["speech_started"]
    assert abs(first[0].ms - 60_000 - truth[0][0]) <= TOLERANCE_MS
    vad.forget_speech()  # the input buffer was cleared mid-speech: the rest of the utterance starts a new turn
    rest = vad.process(samples[int((truth[0][0] + 500) * RATE / 1000):int((truth[0][1] + 1000) * RATE / 1000)])
    assert [e.kind for e in rest] == ["speech_started", "speech_stopped"]
    assert rest[0].ms >= 60_000 + truth[0][0] + 500 - 2 * 32  # the next window heard as speech, less the lead


def test_turn_detection_fields_are_checked():
    assert VadSettings.from_turn_detection({"type": "server_vad"}) == VadSettings()
    settings = VadSettings.from_turn_detection({"threshold": 0.7, "prefix_padding_ms": 100, "silence_duration_ms": 250,
                                                "create_response": False, "interrupt_response": False})
    assert settings == VadSettings(0.7, 100, 250, False, False)
    assert VadSettings.from_turn_detection({"silence_duration_ms": 400.0}).silence_duration_ms == 400
    for field, value in (("threshold", 1.5), ("threshold", "high"), ("prefix_padding_ms", -1),
                         ("silence_duration_ms", 2.5), ("create_response", 1), ("interrupt_response", "yes")):
        with pytest.raises(VadConfigError) as error:
            VadSettings.from_turn_detection({field: value})
        assert error.value.field == field

"""OpenAI's voice names on Qwen3-TTS checkpoints: the mapping onto speakers, and a runner speaking them."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.build_tiny_qwen3 import build
from streamvox.contract import SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.openai_voices import (
    OPENAI_VOICES,
    openai_voice_speakers,
    served_voices,
    speaker_for,
)
from streamvox.models.registry import load_runner
from tests.helpers.openai_voices import openai_sdk_voice_names
from tests.helpers.qwen3_harness import RecordingSink, drain

RELEASED = ["aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian"]


def test_every_openai_sdk_voice_has_a_mapping():
    assert set(openai_sdk_voice_names()) <= set(OPENAI_VOICES)


def test_released_speakers_map_by_preference():
    mapping = openai_voice_speakers(RELEASED)
    assert set(mapping) == set(OPENAI_VOICES)
    assert mapping["marin"] == "serena" and mapping["cedar"] == "aiden" and mapping["onyx"] == "uncle_fu"
    assert mapping["nova"] == "vivian" and mapping["shimmer"] == "ono_anna" and mapping["sage"] == "sohee"
    # The checkpoint's own spelling is kept; the mapping does not depend on the speakers' order.
    capitalised = [name.capitalize() for name in reversed(RELEASED)]
    assert openai_voice_speakers(capitalised)["marin"] == "Serena"


def test_unknown_speakers_fall_back_to_sorted_order():
    mapping = openai_voice_speakers(["zoe", "adam", "kim"])
    assert mapping == {name: ["adam", "kim", "zoe"][i % 3] for i, name in enumerate(OPENAI_VOICES)}
    assert openai_voice_speakers([]) == {}


def test_a_speaker_named_like_an_openai_voice_keeps_its_name():
    mapping = openai_voice_speakers(["echo", "ryan"])
    assert "echo" not in mapping and mapping["ash"] == "ryan"
    assert speaker_for("echo", ["echo", "ryan"]) == "echo"
    assert speaker_for("Marin", ["serena"]) == "serena" and speaker_for("bob", ["serena"]) == "bob"


def test_served_voices_by_task():
    assert served_voices("custom_voice", ["bob", "alice"]) == ["bob", "alice", *OPENAI_VOICES]
    assert served_voices("voice_design", []) == list(OPENAI_VOICES)
    assert served_voices("base", []) == []


@pytest.fixture(scope="module")
def cv_runner(tmp_path_factory):
    return load_runner(str(build(tmp_path_factory.mktemp("cv") / "tiny-cv", "custom_voice", seed=11)), device="cpu")


def _speak(runner, request_id: str, voice: str) -> np.ndarray:
    sink = RecordingSink()
    runner.add(SpeechRequest(request_id=request_id, text="Hello there.", voice=voice, language="english",
                             sampling=SamplingParams(temperature=0.0, max_new_tokens=12)))
    drain(runner, sink)
    assert request_id in sink.done, sink.errors
    return np.concatenate(sink.audio_chunks[request_id])


def test_custom_voice_checkpoint_speaks_openai_names_as_their_speakers(cv_runner):
    assert cv_runner.info.voices[:3] == ["alice", "bob", "dylan"] and set(OPENAI_VOICES) <= set(cv_runner.info.voices)
    assert cv_runner.info.default_voice == "alice"
    mapping = openai_voice_speakers(["alice", "bob", "dylan"])
    for name in ("marin", "cedar", "alloy"):
        as_openai = _speak(cv_runner, name, name)
        assert len(as_openai) and np.array_equal(as_openai, _speak(cv_runner, f"{name}-speaker", mapping[name]))

"""Speech request validation: every OpenAI voice name, and task types in vLLM-Omni's spelling too."""

from __future__ import annotations

import httpx
import pytest

from streamvox.contract import ModelInfo
from streamvox.server.errors import APIError
from streamvox.server.speech_params import parse_speech_settings, task_type_name
from streamvox.settings import MediaPolicy
from tests.helpers.openai_voices import openai_sdk_voice_names

CUSTOM_VOICE = ModelInfo(name="qwen", family="qwen3_tts", sample_rate=24000, voices=["vivian"],
                         default_voice="vivian", task_types=["custom_voice"])


def test_every_openai_sdk_voice_speaks_on_the_default_model(espeak_server):
    listed = httpx.get(f"{espeak_server.url}/v1/audio/voices").json()["voices"]
    for voice in openai_sdk_voice_names():
        assert voice in listed
        response = httpx.post(f"{espeak_server.url}/v1/audio/speech", timeout=30,
                              json={"input": "Hello.", "voice": voice, "response_format": "pcm"})
        assert response.status_code == 200 and len(response.content) > 4800, (voice, response.text[:200])


@pytest.mark.parametrize("spelling", ["CustomVoice", "custom_voice", "custom-voice", "Custom Voice", " customVoice "])
def test_task_type_spellings_name_the_same_task(spelling):
    request = parse_speech_settings({"task_type": spelling}, CUSTOM_VOICE, MediaPolicy())
    assert request.task_type == "custom_voice"


@pytest.mark.parametrize("spelling,task", [("VoiceDesign", "voice_design"), ("Base", "base"), ("base", "base")])
def test_vllm_omni_task_types(spelling, task):
    assert task_type_name(spelling) == task
    info = ModelInfo(name="qwen", family="qwen3_tts", sample_rate=24000, voices=[], default_voice="default",
                     task_types=[task])
    assert parse_speech_settings({"task_type": spelling}, info, MediaPolicy()).task_type == task


def test_a_task_type_the_model_lacks_is_refused_in_the_clients_spelling():
    with pytest.raises(APIError) as refused:
        parse_speech_settings({"task_type": "Base"}, CUSTOM_VOICE, MediaPolicy())
    assert refused.value.param == "task_type" and "'Base'" in refused.value.message
    assert "custom_voice" in refused.value.message

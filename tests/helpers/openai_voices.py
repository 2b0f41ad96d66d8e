"""The voice names in the installed `openai` SDK's speech and realtime (GA and beta) voice lists."""

from __future__ import annotations

import typing

from openai.types.audio import speech_create_params
from openai.types.beta.realtime import session as beta_session
from openai.types.realtime import realtime_audio_config_output


def _literals(annotation) -> set[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return {value for value in typing.get_args(annotation) if isinstance(value, str)}
    return set().union(*(_literals(arg) for arg in typing.get_args(annotation)))


def openai_sdk_voice_names() -> list[str]:
    hints = [speech_create_params.Voice, realtime_audio_config_output.Voice,
             beta_session.Session.model_fields["voice"].annotation]
    names = set().union(*(_literals(hint) for hint in hints))
    assert {"alloy", "marin", "cedar", "fable"} <= names, names  # the SDK's layout changed: update this helper
    return sorted(names)

"""OpenAI's voice names on Qwen3-TTS checkpoints, so clients written for OpenAI TTS work unmodified.

A CustomVoice checkpoint speaks as one of its own speakers: each OpenAI name (every name in the `openai`
SDK's speech and realtime voice lists) plays the first speaker of its preference list that the checkpoint
has: the released speakers nearest in gender and timbre, English natives first. A checkpoint with none of
them (a fine-tune with speakers of its own) plays its speakers in sorted order. A speaker named like an
OpenAI voice keeps its name. A VoiceDesign checkpoint accepts the names and ignores them: its voice is
designed from `instructions`. A Base checkpoint speaks cloned voices only. docs/voices.md lists the mapping.
"""

from __future__ import annotations

from collections.abc import Iterable

# The released CustomVoice speakers (Qwen3-TTS-12Hz-*-CustomVoice), nearest first.
OPENAI_VOICE_PREFERENCES: dict[str, tuple[str, ...]] = {
    "alloy": ("serena", "vivian", "aiden", "ryan"),
    "ash": ("ryan", "aiden", "uncle_fu", "eric", "dylan"),
    "ballad": ("uncle_fu", "ryan", "aiden", "eric", "dylan"),
    "cedar": ("aiden", "ryan", "uncle_fu", "dylan", "eric"),
    "coral": ("vivian", "serena", "sohee", "ono_anna"),
    "echo": ("aiden", "ryan", "dylan", "eric", "uncle_fu"),
    "fable": ("ryan", "aiden", "dylan", "eric", "uncle_fu"),
    "marin": ("serena", "vivian", "sohee", "ono_anna"),
    "nova": ("vivian", "serena", "ono_anna", "sohee"),
    "onyx": ("uncle_fu", "ryan", "aiden", "eric", "dylan"),
    "sage": ("sohee", "serena", "vivian", "ono_anna"),
    "shimmer": ("ono_anna", "vivian", "serena", "sohee"),
    "verse": ("ryan", "aiden", "eric", "dylan", "uncle_fu"),
}
OPENAI_VOICES = tuple(sorted(OPENAI_VOICE_PREFERENCES))


def openai_voice_speakers(speakers: Iterable[str]) -> dict[str, str]:
    """OpenAI name -> the checkpoint speaker (its own spelling) that plays it, for each OpenAI name that is
    not a speaker's name already."""
    by_key = {speaker.lower(): speaker for speaker in speakers}
    ordered = [by_key[key] for key in sorted(by_key)]
    mapping = {}
    for index, name in enumerate(OPENAI_VOICES):
        if name in by_key or not ordered:
            continue
        preferred = next((by_key[key] for key in OPENAI_VOICE_PREFERENCES[name] if key in by_key), None)
        mapping[name] = preferred or ordered[index % len(ordered)]
    return mapping


def served_voices(task: str, speakers: list[str]) -> list[str]:
    """The voice names a checkpoint of `task` accepts (`ModelInfo.voices`), its speakers first."""
    if task == "custom_voice":
        return [*speakers, *openai_voice_speakers(speakers)]
    if task == "voice_design":
        return list(OPENAI_VOICES)
    return []


def speaker_for(voice: str, speakers: Iterable[str]) -> str:
    """The speaker that `voice` names: the OpenAI name's speaker, else `voice` itself."""
    return openai_voice_speakers(speakers).get(voice.strip().lower(), voice)

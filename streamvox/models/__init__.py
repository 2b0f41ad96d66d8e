"""Model families behind one interface (`streamvox.models.base.Runner`)."""

from __future__ import annotations

from streamvox.models.base import Runner

DEFAULT_MODEL = "espeak"


def load_runner(model: str) -> Runner:
    """Build the runner for `model`: `espeak`, or a Qwen3-TTS directory or Hugging Face repo id."""
    if model == "espeak":
        from streamvox.models.espeak import EspeakRunner

        return EspeakRunner()
    from streamvox.models.qwen3_tts.runner import load_runner as load_qwen3_tts

    return load_qwen3_tts(model)

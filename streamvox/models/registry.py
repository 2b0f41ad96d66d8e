"""Model families behind one interface (`streamvox.contract.Runner`)."""

from __future__ import annotations

from streamvox.contract import Runner

DEFAULT_MODEL = "espeak"


def load_runner(model: str, device: str = "auto", dtype: str = "auto", max_batch: int | None = None) -> Runner:
    """Build the runner for `model`: `espeak`, or a Qwen3-TTS directory or Hugging Face repo id.

    `device` "auto" picks CUDA when present; `dtype` "auto" is bfloat16 on CUDA, float32 on the CPU.
    """
    if model == "espeak":
        from streamvox.models.espeak.runner import EspeakRunner

        return EspeakRunner()
    import torch

    from streamvox.models.qwen3_tts.runtime.loader import load_runner as load_qwen3_tts
    from streamvox.settings import Qwen3Settings

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    options = {} if max_batch is None else {"max_batch": max_batch}
    # read here, in the engine core process that runs the model
    return load_qwen3_tts(model, device=device, dtype=getattr(torch, dtype), settings=Qwen3Settings.from_env(),
                          **options)

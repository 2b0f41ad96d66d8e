"""Model families behind one interface (`streamvox.contract.Runner`)."""

from __future__ import annotations

from streamvox.contract import Runner

DEFAULT_MODEL = "espeak"


POCKETSPHINX = "pocketsphinx"  # the CPU word aligner; any other `aligner` is a Qwen3-ForcedAligner checkpoint


def load_runner(model: str, device: str = "auto", dtype: str = "auto", max_batch: int | None = None,
                aligner: str | None = None) -> Runner:
    """Build the runner for `model`: `espeak`, or a Qwen3-TTS directory or Hugging Face repo id.

    `device` "auto" picks CUDA when present; `dtype` "auto" is bfloat16 on CUDA, float32 on the CPU.
    `aligner`: word timings for a model without its own (eSpeak has them): "pocketsphinx" (English, CPU),
    or a Qwen3-ForcedAligner-0.6B directory or repo id, run on the model's device in its dtype.
    """
    if model == "espeak":
        from streamvox.models.espeak.runner import EspeakRunner

        return EspeakRunner()  # times its own words: `aligner` is not needed
    import torch

    from streamvox.models.qwen3_tts.runtime.loader import load_runner as load_qwen3_tts
    from streamvox.settings import Qwen3Settings

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    options = {} if max_batch is None else {"max_batch": max_batch}
    # read here, in the engine core process that runs the model
    settings = Qwen3Settings.from_env()
    runner = load_qwen3_tts(model, device=device, dtype=getattr(torch, dtype), settings=settings, **options)
    if aligner is None or runner.info.word_timestamps:
        return runner
    from streamvox.models.alignment.runner import AligningRunner

    if aligner == POCKETSPHINX:
        from streamvox.models.alignment.pocketsphinx_aligner import PocketsphinxAligner
        from streamvox.models.espeak.library import EspeakLibrary

        espeak = EspeakLibrary()  # pronounces the words CMUdict lacks (numbers, names)
        espeak.set_voice("en-us")
        return AligningRunner(runner, PocketsphinxAligner(espeak.phonemes))
    from streamvox.models.alignment.qwen3_aligner.aligner import Qwen3ForcedAligner

    return AligningRunner(runner, Qwen3ForcedAligner.from_pretrained(aligner, device, getattr(torch, dtype),
                                                                     settings.aligner_graphs, settings.aligner_fused))

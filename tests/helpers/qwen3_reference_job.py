"""Runs the upstream `qwen-tts` implementation on a checkpoint; executed with the reference venv's python.

Reads jobs as JSON on stdin and prints, per job, the codes of each case (see `main`).
The speech tokenizer is replaced by a recorder (talker parity does not involve the codec):
`decode` captures the codes handed to it and `encode` returns the case's given reference codes.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import torch


class _RecordingTokenizer:
    def __init__(self) -> None:
        self.decoded: list[list[list[int]]] = []
        self.ref_codes: torch.Tensor | None = None

    def decode(self, items):
        self.decoded = [item["audio_codes"].tolist() for item in items]
        return [np.zeros(1, dtype=np.float32) for _ in items], 24000

    def encode(self, wavs, sr=None):
        n = len(wavs) if isinstance(wavs, list) else 1
        codes = self.ref_codes if self.ref_codes is not None else torch.zeros(1, 16, dtype=torch.long)
        return SimpleNamespace(audio_codes=[codes] * n)


def load(model_dir: str):
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from safetensors.torch import load_file

    config = Qwen3TTSConfig.from_pretrained(model_dir)
    model = Qwen3TTSForConditionalGeneration(config).eval()
    state = load_file(f"{model_dir}/model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    with open(f"{model_dir}/generation_config.json") as f:
        model.load_generate_config(json.load(f))
    recorder = _RecordingTokenizer()
    model.load_speech_tokenizer(recorder)
    processor = Qwen3TTSProcessor.from_pretrained(model_dir)
    return Qwen3TTSModel(model=model, processor=processor, generate_defaults=model.generate_config), recorder


def run_job(job: dict) -> dict:
    tts, recorder = load(job["model_dir"])
    out = []
    for case in job["cases"]:
        kw = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=case["max_frames"] + 1)
        if "non_streaming_mode" in case:
            kw["non_streaming_mode"] = case["non_streaming_mode"]
        lang = case.get("language") or "Auto"
        if case["task"] == "custom_voice":
            tts.generate_custom_voice(text=case["text"], speaker=case["speaker"], language=lang,
                                      instruct=case.get("instruct"), **kw)
        elif case["task"] == "voice_design":
            tts.generate_voice_design(text=case["text"], instruct=case.get("instruct", ""), language=lang,
                                      **kw)
        else:
            wav = np.asarray(case["ref_audio"], dtype=np.float32)
            recorder.ref_codes = torch.tensor(case["ref_codes"]) if case.get("ref_codes") else None
            tts.generate_voice_clone(text=case["text"], language=lang, ref_audio=(wav, case["ref_sr"]),
                                     ref_text=case.get("ref_text"),
                                     x_vector_only_mode=not case.get("ref_text"), **kw)
        codes = recorder.decoded[0]
        if recorder.ref_codes is not None and case.get("ref_text"):
            codes = codes[len(case["ref_codes"]):]  # the wrapper prepends the reference codes for decoding
        out.append(codes)
    result: dict = {"codes": out}
    if job.get("speaker_embedding_of"):
        wav = np.asarray(job["speaker_embedding_of"]["pcm"], dtype=np.float32)
        result["speaker_embedding"] = tts.model.extract_speaker_embedding(wav, 24000).tolist()
    return result


def run_full_job(job: dict) -> dict:
    """End to end with the checkpoint's real speech tokenizer: returns each case's waveform."""
    from qwen_tts import Qwen3TTSModel

    tts = Qwen3TTSModel.from_pretrained(job["model_dir"])
    wavs = []
    for case in job["cases"]:
        kw = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=case["max_frames"] + 1)
        lang = case.get("language") or "Auto"
        if case["task"] == "custom_voice":
            out, sr = tts.generate_custom_voice(text=case["text"], speaker=case["speaker"], language=lang,
                                                **kw)
        else:
            wav = np.asarray(case["ref_audio"], dtype=np.float32)
            out, sr = tts.generate_voice_clone(text=case["text"], language=lang,
                                               ref_audio=(wav, case["ref_sr"]),
                                               ref_text=case.get("ref_text"),
                                               x_vector_only_mode=not case.get("ref_text"), **kw)
        wavs.append(np.asarray(out[0], dtype=np.float32).tolist())
    return {"wavs": wavs, "sample_rate": sr}


def main() -> None:
    """stdin: {"jobs": [{"model_dir", "cases", "speaker_embedding_of"?}, ...]}; stdout: {"results": [...]}."""
    request = json.load(sys.stdin)
    results = [run_full_job(job) if job.get("full") else run_job(job) for job in request["jobs"]]
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()

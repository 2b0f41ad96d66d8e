"""Run the reference `qwen-tts` speech tokenizer on inputs from a job directory.

Executed by the reference virtualenv's python (not StreamVox's), so it imports
nothing from StreamVox. Usage: python qwen3_codec_ref_runner.py TOKENIZER_DIR JOB_DIR

JOB_DIR holds `decode_{i}.npy` (int64 codes [T, 16]) and `encode_{i}.npy`
(float32 mono PCM at 24 kHz); it receives `decoded_{i}.npy` (float32 waveform,
from one batched `Qwen3TTSTokenizer.decode` call over all decode inputs),
`raw_{i}.npy` (the decoder module's own forward on that request alone, no
chunking) and `encoded_{i}.npy` (int64 codes [T, 16]).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    tok_dir, job = sys.argv[1], Path(sys.argv[2])
    from qwen_tts import Qwen3TTSTokenizer

    tok = Qwen3TTSTokenizer.from_pretrained(tok_dir, device_map="cpu", dtype=torch.float32)
    model = tok.model.float().eval()

    dec_inputs = sorted(job.glob("decode_*.npy"), key=lambda p: int(p.stem.split("_")[1]))
    if dec_inputs:
        codes = [np.load(p) for p in dec_inputs]
        wavs, sr = tok.decode([{"audio_codes": c} for c in codes])
        assert sr == 24000, sr
        for p, w, c in zip(dec_inputs, wavs, codes, strict=True):
            i = p.stem.split("_")[1]
            np.save(job / f"decoded_{i}.npy", np.asarray(w, dtype=np.float32))
            with torch.inference_mode():
                raw = model.decoder(torch.from_numpy(c).long().T[None])  # [1, 1, T * 1920]
            np.save(job / f"raw_{i}.npy", raw[0, 0].float().numpy())

    for p in sorted(job.glob("encode_*.npy")):
        i = p.stem.split("_")[1]
        pcm = np.load(p).astype(np.float32)
        enc = tok.encode(pcm, sr=24000)
        np.save(job / f"encoded_{i}.npy", enc.audio_codes[0].cpu().numpy().astype(np.int64))


if __name__ == "__main__":
    main()

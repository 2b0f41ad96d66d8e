"""Runs the `qwen-asr` package's forced aligner on a checkpoint; executed with the reference venv's python.

Reads a job as JSON on stdin: {"model_dir", "out_dir", "batches": [[{"audio": "x.npy", "text": "..."}, ...]]}.
Each batch is one call of the reference's `align` (16 kHz audio, English). For each batch it saves to
out_dir the features and feature mask the model was given (`features_B.npy`, `feature_mask_B.npy`) and
the head's logits at the `<timestamp>` markers of each item (`logits_B_I.npy`), and prints one JSON line
with each item's timings ([[text, start, end], ...]) and the reference's repair of each of the job's
"repairs" (marker times in ms that go backwards).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    job = json.loads(sys.stdin.read())
    from qwen_asr import Qwen3ForcedAligner

    torch.manual_seed(0)
    aligner = Qwen3ForcedAligner.from_pretrained(job["model_dir"], dtype=torch.float32, device_map="cpu")
    thinker = aligner.model.thinker
    seen = {}

    def record(module, args, kwargs, output):
        seen.update(ids=kwargs["input_ids"], features=kwargs["input_features"],
                    mask=kwargs["feature_attention_mask"], logits=output.logits)

    thinker.register_forward_hook(record, with_kwargs=True)
    out = Path(job["out_dir"])
    results = []
    for b, batch in enumerate(job["batches"]):
        audio = [(np.load(item["audio"]).astype(np.float32), 16000) for item in batch]
        got = aligner.align(audio=audio, text=[item["text"] for item in batch], language="English")
        np.save(out / f"features_{b}.npy", seen["features"].float().numpy())
        np.save(out / f"feature_mask_{b}.npy", seen["mask"].numpy())
        for i, (ids, logits) in enumerate(zip(seen["ids"], seen["logits"], strict=True)):
            np.save(out / f"logits_{b}_{i}.npy", logits[ids == aligner.timestamp_token_id].float().numpy())
        results.append([[[it.text, it.start_time, it.end_time] for it in result] for result in got])
    repairs = [aligner.aligner_processor.fix_timestamp(np.array(times)) for times in job.get("repairs", [])]
    print(json.dumps({"results": results, "repairs": repairs}))


if __name__ == "__main__":
    main()

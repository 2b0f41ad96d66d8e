"""Build a tiny random-weight Qwen3-TTS-12Hz checkpoint (with its speech tokenizer) for benchmarks.

The checkpoint has the real architecture (talker, code predictor, speaker encoder, 12 Hz codec
decoder and encoder) at toy sizes, so it measures the serving path, not a model's quality:

  python benchmarks/build_tiny_qwen3.py /tmp/tiny-cv --task custom_voice
  python benchmarks/serving_bench.py --model /tmp/tiny-cv --stream-format audio \
      --extra-body '{"max_new_tokens": 50}' --lag-streams 0 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "helpers"))

TASKS = ("custom_voice", "voice_design", "base")
CODEBOOK = 64  # the tiny speech tokenizer's codebook size


def build(out: str | Path, task: str = "custom_voice", seed: int = 0) -> Path:
    """Write the checkpoint to `out` (talker seed `seed`, speech tokenizer seed 3) and return its path."""
    from tests.helpers.qwen3_tiny import build_tiny_checkpoint
    from tests.helpers.qwen3_tiny_codec import build_tiny_speech_tokenizer

    return build_tiny_checkpoint(Path(out), task, seed=seed, codebook_size=CODEBOOK,
                                 speech_tokenizer_builder=lambda d: build_tiny_speech_tokenizer(d, seed=3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="directory to write the checkpoint to")
    parser.add_argument("--task", choices=TASKS, default="custom_voice")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out, args.task, args.seed))


if __name__ == "__main__":
    main()

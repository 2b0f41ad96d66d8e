#!/usr/bin/env bash
# Build a CPU-only virtualenv holding the reference Qwen3-TTS implementation
# (`qwen-tts`, transformers-based) and the reference Qwen3-ForcedAligner (`qwen-asr`)
# for parity tests.  Idempotent: re-running it on a finished venv only re-checks the
# imports and exits; on a venv that lacks a part, it installs what is missing.
#
#   scripts/setup_reference_venv.sh TARGET_DIR
#
# qwen-tts's declared dependencies include gradio (only for its demo CLI), which
# makes pip backtrack for a long time, so qwen-tts goes in with --no-deps and we
# install just what `import qwen_tts` and inference need.  torch is the CPU build
# (REF_TORCH_SPEC overrides it).  torchaudio is needed only for the pure-python
# `torchaudio.compliance.kaldi` import; its compiled extension libraries are built
# for a different torch (and CUDA), so they are moved aside and torchaudio falls
# back to its python-only parts.
#
# qwen-asr pins transformers==4.57.6 (and gradio, vllm extras); it goes in with
# --no-deps too, on qwen-tts's transformers 4.57.3, which its aligner runs with. Its
# aligner module imports nagisa (Japanese word splitting) at import time, so nagisa
# and its dependencies (six, DyNet38) are installed; soynlp (Korean) is imported only
# when used, and is not.
set -euo pipefail

TARGET="${1:?usage: $0 TARGET_DIR}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${REF_TORCH_SPEC:-torch==2.13.0+cpu}"
TORCHAUDIO_SPEC="${REF_TORCHAUDIO_SPEC:-torchaudio==2.11.1}"

if [ -f "$TARGET/READY" ] && "$TARGET/bin/python" -c "import qwen_tts, qwen_asr" >/dev/null 2>&1; then
    echo "reference venv at $TARGET is ready"
    exit 0
fi

[ -x "$TARGET/bin/python" ] || "$PYTHON" -m venv "$TARGET"
PIP=("$TARGET/bin/python" -m pip install --quiet)

# CPU torch first (the machine image's wheel cache has the +cpu build; REF_TORCH_SPEC overrides).
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" --no-deps "$TORCHAUDIO_SPEC"
"${PIP[@]}" --no-deps "qwen-tts==0.1.1"
# Versions qwen-tts 0.1.1 pins, plus what its modules import (gradio is only for its demo).
# numpy<2.4: numba, pulled in by librosa, lags numpy releases.
"${PIP[@]}" "transformers==4.57.3" "accelerate==1.12.0" "librosa" "soundfile" "sox" \
    "onnxruntime" "einops" "numpy<2.4"
"${PIP[@]}" --no-deps "qwen-asr==0.0.6" "nagisa==0.2.11"
"${PIP[@]}" "six" "DyNet38"

# Move torchaudio's compiled extensions aside (keep them for inspection).
TA_DIR="$("$TARGET/bin/python" - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("torchaudio")
print(os.path.dirname(spec.origin))
PY
)"
mkdir -p "$TARGET/torchaudio-libs-aside"
find "$TA_DIR" -name "*.so*" -print0 | while IFS= read -r -d '' lib; do
    rel="${lib#"$TA_DIR"/}"
    mkdir -p "$TARGET/torchaudio-libs-aside/$(dirname "$rel")"
    mv "$lib" "$TARGET/torchaudio-libs-aside/$rel"
done

"$TARGET/bin/python" - <<'PY'
import torch
import qwen_tts  # noqa: F401
from qwen_tts.core.models import Qwen3TTSForConditionalGeneration  # noqa: F401
from qwen_asr import Qwen3ForcedAligner  # noqa: F401
print("qwen_tts and qwen_asr import with torch", torch.__version__)
PY
touch "$TARGET/READY"
echo "reference venv at $TARGET is ready"

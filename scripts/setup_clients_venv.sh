#!/usr/bin/env bash
# Create (or refresh) a virtualenv with the voice-agent frameworks that tests/clients/ drive a real server with:
# LiveKit Agents with its OpenAI and Cartesia plugins, and Pipecat with its OpenAI and Cartesia services (Pipecat's
# Cartesia service needs nothing beyond its base install).
# Idempotent: re-running on a finished venv only checks it.
#   usage: scripts/setup_clients_venv.sh DIR
# The frameworks pin their own dependencies (openai, aiohttp, numpy, protobuf...), so they get a venv of their
# own instead of the main one; the tests run scripts in it that talk to `streamvox serve` over HTTP/WebSocket.
set -euo pipefail
DIR=${1:?usage: $0 DIR}
LIVEKIT_AGENTS_VERSION=${LIVEKIT_AGENTS_VERSION:-1.8.9}
PIPECAT_VERSION=${PIPECAT_VERSION:-1.14.0}
PY=${PYTHON:-python3}

if [ -x "$DIR/bin/python" ] && "$DIR/bin/python" -c "import livekit.agents, livekit.plugins.openai, livekit.plugins.cartesia, pipecat, av" 2>/dev/null
then
  echo "clients venv ready: $DIR"
  exit 0
fi

"$PY" -m venv "$DIR"
"$DIR/bin/pip" install -q --upgrade pip
"$DIR/bin/pip" install -q "livekit-agents==${LIVEKIT_AGENTS_VERSION}" \
  "livekit-plugins-openai==${LIVEKIT_AGENTS_VERSION}" "livekit-plugins-cartesia==${LIVEKIT_AGENTS_VERSION}" \
  "pipecat-ai[openai]==${PIPECAT_VERSION}" av
"$DIR/bin/python" - <<'PY'
from importlib.metadata import version
print(", ".join(f"{name} {version(name)}" for name in
                ("livekit-agents", "livekit-plugins-openai", "livekit-plugins-cartesia", "pipecat-ai", "openai", "av")))
PY

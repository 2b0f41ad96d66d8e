#!/usr/bin/env bash
# The one-launch kernels' queued runs on a GPU machine (README.md beside this file): where each kernel's time
# goes, then every variant under tools/kernel_lab/variants/ against the shipped kernel on the same GPU.
# Output and JSON go to $OUT. Parts, each within one 600 s call of the device tool:
#   bash tools/kernel_lab/run_kernel_variants.sh talker     # stamps of the talker kernel, then its A/B
#   bash tools/kernel_lab/run_kernel_variants.sh predictor  # the same for the predictor kernel
#   bash tools/kernel_lab/run_kernel_variants.sh serve      # one stream served as shipped, then with the A/B runs'
#                                                           # winners (ab_winner.py) written over the tree's kernel
#                                                           # sources, which are put back afterwards
# `serve` reads the A/B runs' JSON from $OUT: where $OUT is emptied between calls (the device tool), give all
# three parts the same OUT=/tmp/kv and copy it out at the end.
# The checkpoint (1.7B shapes, random weights) is built first unless $MODEL already holds one.
set -euo pipefail
cd "$(dirname "$0")/../.."
which=${1:?talker, predictor or serve}
OUT=${OUT:-/tmp/kernel-variants}
MODEL=${MODEL:-/tmp/q}
V=tools/kernel_lab/variants
K=streamvox/models/qwen3_tts/kernels
mkdir -p "$OUT"
# (the checkpoint's last file: a run cut short leaves none)
[ -f "$MODEL/speech_tokenizer/preprocessor_config.json" ] || python3 benchmarks/make_real_shape_checkpoint.py --size 1.7b --out "$MODEL"

serve() {  # serve NAME: one stream, 16 requests of 10 s after the warm-up, killed after 180 s
  timeout 180 python3 benchmarks/gpu_bench.py --model "$MODEL" --serve --concurrency 1 --clients raw --max-batch 2 \
    --json-out "$OUT/serve-c1-$1.json" || echo "# serve $1: exit $? (124: killed after 180 s)"
}

# `serve` serves and stops here. The other parts make two A/B runs a kernel: the variants that only move work
# or reads, then (on their own, so that a hang loses only them) those that change how the warps or blocks hand
# work to each other. A variant that hangs is killed with its run.
case $which in
  serve)
    winners=$(python3 tools/kernel_lab/ab_winner.py "$OUT"/ab-*.json)
    serve shipped
    if [ -n "$winners" ]; then
      saved=$(mktemp -d)
      cp "$K"/*.cu "$K"/*.cuh "$saved"
      trap 'cp "$saved"/* "$K"/' EXIT  # the shipped sources back, however the serve ends
      python3 tools/kernel_lab/kernel_sources.py "$winners"
      serve winners
    fi
    exit ;;
  talker)
    safe=("$V/talker-grid-128.patch" "$V/talker-attention-batched-reads.patch" "$V/talker-input-in-registers.patch"
          "$V/talker-grid-128.patch+$V/talker-attention-batched-reads.patch+$V/talker-input-in-registers.patch")
    handoff=("$V/talker-input-in-registers.patch+$V/talker-sums-at-phase-end.patch" "$V/talker-claimed-chunks.patch"
             "$V/talker-grid-128.patch+$V/talker-attention-batched-reads.patch+$V/talker-claimed-chunks.patch") ;;
  predictor)
    safe=("$V/predictor-grid-128.patch" "$V/predictor-split-rows.patch"
          "$V/predictor-split-rows.patch+$V/predictor-gate-up-halves.patch"
          "$V/predictor-grid-128.patch+$V/predictor-split-rows.patch+$V/predictor-gate-up-halves.patch")
    handoff=() ;;
  *) echo "talker, predictor or serve" >&2; exit 2 ;;
esac

ab() {  # ab NAME SECONDS VARIANT...: the shipped kernel against the variants, killed after SECONDS
  local name=$1 limit=$2 args=()
  shift 2
  for v in "$@"; do args+=(--patch "$v"); done
  timeout "$limit" python3 tools/kernel_lab/kernel_ab.py --model "$MODEL" --kernel "$which" "${args[@]}" \
    --json-out "$OUT/ab-$which-$name.json" || echo "# kernel_ab $name: exit $? (124: killed after $limit s)"
}

python3 tools/kernel_lab/kernel_stamps.py --model "$MODEL" --kernel "$which" --json-out "$OUT/stamps-$which.json"
ab safe 300 "${safe[@]}"
if [ ${#handoff[@]} -gt 0 ]; then ab handoff 180 "${handoff[@]}"; fi

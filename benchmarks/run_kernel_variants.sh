#!/usr/bin/env bash
# The one-launch kernels' next runs on a GPU machine (RESULTS.md, "Runs to make next", item 2 (a)-(b)): where each
# kernel's time goes, then every variant under benchmarks/variants/ against the shipped kernel on the same GPU.
# Output and JSON go to $OUT. Parts, each within one 600 s call of the device tool:
#   bash benchmarks/run_kernel_variants.sh talker       # stamps of the talker kernel, then its A/B
#   bash benchmarks/run_kernel_variants.sh predictor    # the same for the predictor kernel
# The checkpoint (1.7B shapes, random weights) is built first unless $MODEL already holds one.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?talker or predictor}
OUT=${OUT:-/tmp/kernel-variants}
MODEL=${MODEL:-/tmp/q}
V=benchmarks/variants
mkdir -p "$OUT"
# (the checkpoint's last file: a run cut short leaves none)
[ -f "$MODEL/speech_tokenizer/preprocessor_config.json" ] || python3 benchmarks/make_real_shape_checkpoint.py --size 1.7b --out "$MODEL"

case $which in
  talker)
    variants=("$V/talker-grid-128.patch" "$V/talker-attention-batched-reads.patch"
              "$V/talker-input-in-registers.patch"
              "$V/talker-input-in-registers.patch+$V/talker-sums-at-phase-end.patch"
              "$V/talker-grid-128.patch+$V/talker-attention-batched-reads.patch+$V/talker-input-in-registers.patch+$V/talker-sums-at-phase-end.patch") ;;
  predictor)
    variants=("$V/predictor-grid-128.patch" "$V/predictor-split-rows.patch"
              "$V/predictor-grid-128.patch+$V/predictor-split-rows.patch") ;;
  *) echo "talker or predictor" >&2; exit 2 ;;
esac

python3 benchmarks/kernel_stamps.py --model "$MODEL" --kernel "$which" --json-out "$OUT/stamps-$which.json"
patches=()
for v in "${variants[@]}"; do patches+=(--patch "$v"); done
python3 benchmarks/kernel_ab.py --model "$MODEL" --kernel "$which" "${patches[@]}" --json-out "$OUT/ab-$which.json"

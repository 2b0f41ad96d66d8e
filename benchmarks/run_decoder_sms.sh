#!/usr/bin/env bash
# One stream's RTF with the one-launch kernels leaving N multiprocessors to the codec decoder's kernels
# (STREAMVOX_QWEN3_DECODER_SMS; docs/gpu.md says why): one server a value, in the order given (default 0 8 4),
# each serving 16 requests of 10 s at concurrency 1 after its warm-up. Output and JSON go to $OUT. Three servers
# fit one 600 s call of the device tool (~100-150 s each, the kernels built by the first and cached for the
# rest); each is killed after 180 s.
#   bash benchmarks/run_decoder_sms.sh            # 0 8 4
#   bash benchmarks/run_decoder_sms.sh 0 16 12    # other values
#   STREAMVOX_QWEN3_TIMING=1 bash benchmarks/run_decoder_sms.sh 0 8   # the servers log each decoder call's GPU time
# The checkpoint (1.7B shapes, random weights) is built first unless $MODEL already holds one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/decoder-sms}
MODEL=${MODEL:-/tmp/q}
values=("$@")
[ ${#values[@]} -gt 0 ] || values=(0 8 4)
mkdir -p "$OUT"
# (the checkpoint's last file: a run cut short leaves none)
[ -f "$MODEL/speech_tokenizer/preprocessor_config.json" ] || python3 benchmarks/make_real_shape_checkpoint.py --size 1.7b --out "$MODEL"
i=0
for n in "${values[@]}"; do
  i=$((i + 1))
  echo "# STREAMVOX_QWEN3_DECODER_SMS=$n"
  STREAMVOX_QWEN3_DECODER_SMS=$n timeout 180 python3 benchmarks/gpu_bench.py --model "$MODEL" --serve \
    --concurrency 1 --clients raw --max-batch 2 --json-out "$OUT/serve-c1-sms$n-run$i.json" \
    || echo "# STREAMVOX_QWEN3_DECODER_SMS=$n: exit $? (124: killed after 180 s)"
done

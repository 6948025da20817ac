#!/usr/bin/env bash
# Pipelined prefill on k3-small: 2 stages (one thread each, two MPI ranks)
# against 1 stage (one thread), for a prompt of T tokens cut into chunks.
# Prints the speedup against the ideal 2.0, each stage's bubble (idle)
# fraction and the bytes per token crossing the boundary, per chunk size.
#
#   bash bench/pipeline_bench.sh [T] [chunk sizes...]     (default 32768 2048)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
T=${1:-32768}
shift || true
chunks=("${@:-2048}")
[[ ${#chunks[@]} -gt 0 ]] || chunks=(2048)
bin=${BIN_DIR:-build/bin}/deltaserve  # BIN_DIR: another build to measure
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk -v n="$T" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%d ", int(rand() * 256) }' > "$work/tokens"

echo "| chunk | 1 stage s | 2 stages s | speedup (ideal 2.0) | bubble stage 0 | bubble stage 1 | bytes/token 0->1 |"
echo "|---|---|---|---|---|---|---|"
for chunk in "${chunks[@]}"; do
  one=$($bin score --threads 1 --model "$model" --tokens-file "$work/tokens" \
        --prefill-chunk "$chunk" --logits-out "$work/one.safetensors" --stats 2>&1 |
        sed -n 's/^score: .* in \([0-9.]*\) s.*/\1/p')
  log=$(OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to core \
        $bin score --threads 1 --pp 2 --model "$model" --tokens-file "$work/tokens" \
        --prefill-chunk "$chunk" --logits-out "$work/two.safetensors" --stats 2>&1)
  two=$(sed -n 's/^score: .* in \([0-9.]*\) s.*/\1/p' <<<"$log")
  bubble() {  # 1 - compute / busy for one stage
    sed -n "s/.*stage $1 .*compute \([0-9.]*\) s of \([0-9.]*\) s.*/\1 \2/p" <<<"$log" |
      awk '{ printf "%.1f%%", 100 * (1 - $1 / $2) }'
  }
  bytes=$(sed -n 's/.*stage 0 .*(\([0-9]*\) bytes\/token).*/\1/p' <<<"$log")
  speedup=$(awk -v a="$one" -v b="$two" 'BEGIN { printf "%.2fx", a / b }')
  echo "| $chunk | $one | $two | $speedup | $(bubble 0) | $(bubble 1) | $bytes |"
done

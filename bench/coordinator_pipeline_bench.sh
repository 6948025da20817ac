#!/usr/bin/env bash
# Long-prompt prefill through the coordinator on k3-small: a worker job of 2
# pipeline stages (two MPI ranks, one thread each) against one stage (one
# rank, one thread), both behind the same `deltaserve coordinator`. Prints
# the time to first token of each and the speedup against the ideal 2.0.
#
#   bash bench/coordinator_pipeline_bench.sh [prompt tokens] [step tokens]   (default 16384 2048)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
T=${1:-16384}
step=${2:-2048}
bin=build/bin/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null
run=$(mktemp -d)
tokens=$(awk -v n="$T" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), int(rand() * 256) }')
source bench/coordinator_lib.sh
coordinator= worker=
trap 'kill -TERM $coordinator $worker 2>/dev/null; wait 2>/dev/null; rm -rf "$run"' EXIT
start_coordinator "$model" "$run" --step-tokens "$step"

ttft() {  # $1: ranks; prints the time to first token in ms
  start_worker "$1" "$model" "$run/worker$1.log" --plan-context "$T"
  $bin client generate --server "$address" --tokens "$tokens" --max-tokens 1 --ids 2>&1 >/dev/null |
    sed -n 's/.*time to first token: \([0-9.]*\) ms.*/\1/p'
  stop_worker
}
one=$(ttft 1)
two=$(ttft 2)
echo "| prompt tokens | step tokens | 1 stage TTFT ms | 2 stages TTFT ms | speedup (ideal 2.0) |"
echo "|---|---|---|---|---|"
awk -v T="$T" -v s="$step" -v a="$one" -v b="$two" \
  'BEGIN { printf "| %d | %d | %.0f | %.0f | %.2f |\n", T, s, a, b, a / b }'

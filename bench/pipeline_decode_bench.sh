#!/usr/bin/env bash
# Decode through a pipelined worker on k3-small: `deltaserve coordinator` with,
# behind it, first a one-stage worker (one rank, one thread), then a two-stage
# worker job (two ranks, one thread each), both driven by bench-serve at 1, 8
# and 32 concurrent clients. Prints each row and the 2-stage/1-stage ratio of
# output tokens/s per client count; the ideal is 2.0 (two cores against one).
# Workers behind a link decode ahead of their results (the scheduler's
# decode_ahead), so the coordinator's round trip is off the critical path.
#
#   bash bench/pipeline_decode_bench.sh [prompt tokens] [output tokens] [clients]
#   (default 8 64 1,8,32)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
prompt=${1:-8}
output=${2:-64}
clients=${3:-1,8,32}
bin=build/bin/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null
run=$(mktemp -d)
source bench/coordinator_lib.sh
coordinator= worker=
trap 'kill -TERM $coordinator $worker 2>/dev/null; wait 2>/dev/null; rm -rf "$run"' EXIT
start_coordinator "$model" "$run" --step-tokens 512

rows() {  # $1: ranks (= stages); bench-serve's table rows
  start_worker "$1" "$model" "$run/worker$1.log" --plan-context 1024
  $bin bench-serve --server "$address" --concurrency "$clients" --prompt-tokens "$prompt" \
    --max-tokens "$output" 2>&1 | grep '^| [0-9]'
  stop_worker
}
one=$(rows 1)
two=$(rows 2)
echo "| clients | 1 stage output tokens/s | 2 stages output tokens/s | ratio (ideal 2.0) | 1 stage TPOT median ms | 2 stages TPOT median ms |"
echo "|---|---|---|---|---|---|"
paste -d'\n' <(echo "$one") <(echo "$two") |
  awk -F'|' 'NR % 2 == 1 { c = $2; a = $5; ta = $8 } NR % 2 == 0 {
    printf "|%s| %.1f | %.1f | %.2f | %.2f | %.2f |\n", c, a, $5, $5 / a, ta, $8 }'

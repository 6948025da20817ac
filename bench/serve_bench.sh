#!/usr/bin/env bash
# Serving on k3-small: starts `deltaserve serve`, drives it with bench-serve at
# 1, 8 and 32 concurrent streaming clients over gRPC and over the OpenAI HTTP
# API (each row over both, one after the other), and measures the serving overhead
# of one request against the same request through `deltaserve generate`'s
# code path (alternated, in the same run). Prints markdown for
# docs/performance.md.
#
#   bash bench/serve_bench.sh [prompt tokens] [output tokens]   (default 128 64)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
prompt=${1:-128}
output=${2:-64}
bin=build/bin/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null
run=$(mktemp -d)
server=
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$run"' EXIT
source deploy/serve_lib.sh
start_serve "$model" "$run" --http-port 0
$bin bench-serve --server "$address" --http "$http_address" --concurrency 1,8,32 \
  --prompt-tokens "$prompt" --max-tokens "$output" --compare-model "$model"

#!/usr/bin/env bash
# Two builds of deltaserve side by side on this machine, in turn, ROUNDS
# times: prefill and decode on k3-small (model_bench, with the sgemm rate and
# the memory bandwidth it measures in the same run), questions forked from one
# document (prefix_bench: time and the state bytes each fork copies), the peak
# RSS of a T-token score on k3-tiny (/usr/bin/time), and pipelined prefill on
# 2 stages against 1 (pipeline_bench.sh). For a change that must not slow
# anything down: compare the rounds of the two builds, not runs on different
# days or machines.
#
#   bash bench/before_after.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [T]   (2, 65536)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h || $# -lt 2 ]]; then
  sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-2} T=${4:-65536}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$new/deltaserve" make-model --preset k3-tiny --out "$work/tiny" --seed 1 >/dev/null 2>&1
awk -v n="$T" 'BEGIN { srand(2); for (i = 0; i < n; i++) printf "%d ", int(rand() * 256) }' \
  > "$work/tokens"
for round in $(seq "$rounds"); do
  for side in old new; do
    bin=${!side}
    echo "## round $round, $side build ($bin)"
    "$bin/model_bench" --prompts 2048 --decode 32 2>&1 | grep -E '^\|' || true
    "$bin/prefix_bench" --document 4096 --questions 4 --question-tokens 32 --max-tokens 32 \
      --rounds 1 2>&1 | grep -E '^\|' || true
    /usr/bin/time -f 'score %U s user, peak RSS %M KiB' "$bin/deltaserve" score \
      --model "$work/tiny" --tokens-file "$work/tokens" --prefill-chunk 8192 \
      --logprobs-out "$work/lp.safetensors" 2>&1 | grep -E '^score' || true
    BIN_DIR=$bin bash bench/pipeline_bench.sh 8192 2048 | tail -1
  done
done

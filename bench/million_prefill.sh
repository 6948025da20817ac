#!/usr/bin/env bash
# A million-token prompt end to end (docs/performance.md, "A million-token
# prefill"): `deltaserve coordinator` with a 2-stage MPI worker (two ranks, one
# thread each) behind it, on a K3-shaped model small enough for a 2-core
# machine (bench/million_k3_config.json: K3's rhythm of three KDA layers to one
# MLA layer, attention residuals in blocks of 2 layers, latent MoE of 8
# experts; 1 MLA head over an 8-wide latent keeps MLA's quadratic prefill to
# minutes). It times the first token of a greedy generation, then scores the
# same prompt through the same pipeline (every position's logits computed:
# each log-prob must be finite), then stops the worker, whose --stats give
# each rank's peak resident memory and the bytes sent across the stage
# boundary, and runs the same prompt in one process to compare the tokens.
# Prints the report as markdown; the files it read stay in the run folder.
#
#   bash bench/million_prefill.sh [prompt tokens] [step tokens] [run folder]
#   (default 1048576 65536 /tmp/deltaserve_million_run: a step budget of 65536 tokens at
#   prefix 0 keeps steps near a second each, so chunks stay in the hundreds of tokens at 1M)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
T=${1:-1048576}
step=${2:-65536}
run=${3:-/tmp/deltaserve_million_run}
new=4  # tokens generated
bin=build/bin/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_million}
[[ -f $model/model.safetensors ]] ||
  $bin make-model --config bench/million_k3_config.json --out "$model" --seed 1 >/dev/null
rm -rf "$run" && mkdir -p "$run"
vocab=$(sed -n 's/.*"vocab_size": \([0-9]*\).*/\1/p' "$model/config.json" | head -1)
awk -v n="$T" -v v="$vocab" 'BEGIN { srand(1); for (i = 0; i < n; i++) print int(rand() * v) }' \
  >"$run/prompt.txt"
$bin plan --model "$model" --pp 2 --tp 1 --context "$T" >"$run/plan.txt"

source bench/coordinator_lib.sh
coordinator= worker=
trap 'kill -TERM $coordinator $worker 2>/dev/null; wait 2>/dev/null' EXIT
start_coordinator "$model" "$run" --step-tokens "$step" --step-log "$run/steps.jsonl"
start_worker 2 "$model" "$run/worker.log" --plan-context "$T" --stats

start=$(date +%s%N)
$bin client generate --server "$address" --tokens-file "$run/prompt.txt" --max-tokens $new \
  --ids --ignore-eos >"$run/pipeline_tokens.txt" 2>"$run/generate.log"
generate_s=$((($(date +%s%N) - start) / 1000000))  # ms
generate_steps=$(wc -l <"$run/steps.jsonl")
start=$(date +%s%N)
$bin client score --server "$address" --tokens-file "$run/prompt.txt" >"$run/score.txt" \
  2>"$run/score.log"
score_s=$((($(date +%s%N) - start) / 1000000))  # ms
stop_worker

start=$(date +%s%N)
$bin generate --model "$model" --tokens-file "$run/prompt.txt" --max-tokens $new --ids \
  --ignore-eos --prefill-chunk "$step" >"$run/single_tokens.txt" 2>"$run/single.log"
single_s=$((($(date +%s%N) - start) / 1000000))  # ms

ttft=$(sed -n 's/.*time to first token: \([0-9.]*\) ms.*/\1/p' "$run/generate.log")
echo "## A million-token prefill: $T prompt tokens, steps of $step tokens"
echo
echo "- time to first token through the coordinator and 2 stages: $(awk -v t="$ttft" 'BEGIN { printf "%.1f s", t / 1000 }') (generation of $new tokens: $(awk -v t="$generate_s" 'BEGIN { printf "%.1f", t / 1000 }') s; the score of the same prompt: $(awk -v t="$score_s" 'BEGIN { printf "%.1f", t / 1000 }') s; one process, default threads: $(awk -v t="$single_s" 'BEGIN { printf "%.1f", t / 1000 }') s)"
echo "- generated tokens, pipeline: $(tr '\n' ' ' <"$run/pipeline_tokens.txt"); one process: $(tr '\n' ' ' <"$run/single_tokens.txt")$(cmp -s "$run/pipeline_tokens.txt" "$run/single_tokens.txt" && echo ' (equal)' || echo ' (DIFFERENT)')"
awk -v T="$T" '{ n++; if ($2 != $2 + 0 || $2 == "nan" || $2 == "-nan" || $2 ~ /inf/ || $2 > 0) bad++ }
  END { printf "- log-probs of the score: %d of %d expected, %d not finite or above 0\n", n, T - 1, bad }' \
  "$run/score.txt"
echo
echo "Per rank (worker --stats at exit; planner: \`deltaserve plan --model M --pp 2 --tp 1 --context $T\`):"
echo
echo "| rank | peak resident MB | planner: weights + KDA state + MLA cache MB | sent to the next stage |"
echo "|---|---|---|---|"
for r in 0 1; do
  rss=$(sed -n "s/^rank $r: .*peak resident memory \([0-9.]*\) MB.*/\1/p" "$run/worker.log")
  sent=$(sed -n "s/^rank $r: .*; sent \([0-9]*\) bytes for \([0-9]*\) tokens.*(\([0-9]*\) bytes\/token).*/\1 bytes, \2 tokens, \3 bytes\/token/p" "$run/worker.log")
  planned=$(awk -v s="$r" '$1 == s && $2 ~ /-/ { for (i = 1; i <= NF; i++) if ($i ~ /^\(/) { v[++k] = $i } }
    END { gsub(/[()]/, "", v[1]); gsub(/[()]/, "", v[2]); gsub(/[()]/, "", v[3]); printf "%.1f", (v[1] + v[2] + v[3]) / 1e6 }' "$run/plan.txt")
  echo "| $r | $rss | $planned | ${sent:--} |"
done
echo
echo "Chunks along the prompt (generation run; from --step-log; every $((generate_steps / 32 + 1))th step with a prefill chunk):"
echo
echo "| prefix tokens | chunk tokens | step wall ms | stage 0 compute ms | stage 1 compute ms |"
echo "|---|---|---|---|---|"
head -n "$generate_steps" "$run/steps.jsonl" | grep '"prefill":\[{' |
  awk -v every=$((generate_steps / 32 + 1)) '(NR - 1) % every == 0 {
    match($0, /"tokens":[0-9]+,"prefix":[0-9]+/); split(substr($0, RSTART, RLENGTH), p, /[:,]/)
    match($0, /"wall_s":[0-9.e-]+/); w = substr($0, RSTART + 9, RLENGTH - 9)
    match($0, /"stage_compute_s":\[[^]]*\]/); split(substr($0, RSTART + 19, RLENGTH - 20), c, ",")
    printf "| %d | %d | %.1f | %.1f | %.1f |\n", p[4], p[2], w * 1e3, c[1] * 1e3, c[2] * 1e3 }'
echo
echo "Steps: $generate_steps for the generation (prefill chunks and decode), $(($(wc -l <"$run/steps.jsonl") - generate_steps)) for the score."

#!/usr/bin/env bash
# The prefix cache on k3-small, through `deltaserve serve`. Prints markdown for
# docs/performance.md.
#
# (1) A chat of TURNS turns over a system prompt of SYSTEM tokens: each turn's
#     prompt is the last one, its greedy reply (REPLY tokens) and USER new tokens.
#     Each turn goes to a server with the prefix cache (the default budget) and
#     then to one without (--prefix-cache-bytes 0); the table has both times to
#     first token (the servers' own timings) and the ideal for the cached one:
#     the cold time scaled to the tokens it has to prefill (those past the cache
#     hit), which a turn that costs only its new tokens would take.
# (2) QUESTIONS questions of 32 tokens about one DOCUMENT-token document through
#     `deltaserve batch --server` (the long-document form, 32 greedy tokens
#     each, all sent at once), to the server with the cache and to the one
#     without, beside the embedded long-document form (`deltaserve batch
#     --model`, which prefills the document once and forks it).
#
#   bash bench/prefix_cache_bench.sh [TURNS SYSTEM USER REPLY DOCUMENT QUESTIONS]
#                                    (default 10 8192 64 32 16384 4)
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
turns=${1:-10}
system=${2:-8192}
user=${3:-64}
reply=${4:-32}
document=${5:-16384}
questions=${6:-4}
bin=build/bin/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null
run=$(mktemp -d)
cached_server= cold_server=
trap 'kill -TERM $cached_server $cold_server 2>/dev/null; wait 2>/dev/null; rm -rf "$run"' EXIT
source deploy/serve_lib.sh
mkdir -p "$run/cached" "$run/cold"
start_serve "$model" "$run/cached"
cached_server=$server cached=$address
start_serve "$model" "$run/cold" --prefix-cache-bytes 0
cold_server=$server cold=$address

# N random token ids below 256 (the smallest vocabulary of the presets), comma separated.
tokens() { python3 -c "import random; r = random.Random($2); print(','.join(str(r.randrange(256)) for _ in range($1)))"; }

# One request: prints "TTFT_MS CACHED_TOKENS IDS" from `client generate`.
ask() {
  local out
  out=$($bin client generate --server "$1" --tokens-file "$2" --max-tokens "$reply" --ids \
    --ignore-eos 2>"$run/err") || { cat "$run/err" >&2; exit 1; }
  local ttft cached_tokens
  ttft=$(sed -n 's/.*time to first token: \([0-9.]*\) ms.*/\1/p' "$run/err")
  cached_tokens=$(sed -n 's/.*prompt tokens: [0-9]* (\([0-9]*\) cached).*/\1/p' "$run/err")
  echo "$ttft $cached_tokens $(echo "$out" | head -1 | tr ' ' ',')"
}

echo "### A chat of $turns turns over a $system-token system prompt"
echo
echo "| turn | prompt | cached | prefilled | TTFT, no cache | TTFT, cache | speedup | ideal | same tokens |"
echo "|---|---|---|---|---|---|---|---|---|"
prompt=$(tokens "$system" 1)
cold_total=0 cached_total=0
for ((t = 1; t <= turns; t++)); do
  prompt="$prompt,$(tokens "$user" $((100 + t)))"
  echo "$prompt" >"$run/prompt"
  n=$(tr ',' '\n' <"$run/prompt" | wc -l)
  read -r hot hit ids < <(ask "$cached" "$run/prompt")
  read -r cold_ms _ cold_ids < <(ask "$cold" "$run/prompt")
  same=yes
  [[ $ids == "$cold_ids" ]] || same=no
  python3 - "$t" "$n" "$hit" "$cold_ms" "$hot" "$same" <<'EOF'
import sys
t, n, hit, cold, hot, same = sys.argv[1:]
n, hit, cold, hot = int(n), int(hit), float(cold), float(hot)
prefilled = n - hit
ideal = cold * prefilled / n
print(f"| {t} | {n:,} | {hit:,} | {prefilled:,} | {cold:,.0f} ms | {hot:,.0f} ms | "
      f"{cold / hot:.1f}x | {ideal:,.0f} ms | {same} |")
EOF
  prompt="$prompt,$ids"
done

echo
echo "### $questions questions about a $document-token document, `deltaserve batch`"
echo
python3 - "$document" "$questions" >"$run/batch.jsonl" <<'EOF'
import json, random, sys
document, questions = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(7)
doc = [r.randrange(256) for _ in range(document)]
qs = [[r.randrange(256) for _ in range(32)] for _ in range(questions)]
print(json.dumps({"id": "d", "document": doc, "questions": qs, "max_tokens": 32,
                  "ignore_eos": True}))
EOF
timed_batch() {
  local name=$1
  shift
  local start end
  start=$(date +%s.%N)
  $bin batch --input "$run/batch.jsonl" --output "$run/$name.jsonl" "$@" 2>"$run/err" ||
    { cat "$run/err" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.1f}')"
}
t_embedded=$(timed_batch embedded --model "$model")
t_cached=$(timed_batch cached --server "$cached")
t_cold=$(timed_batch cold --server "$cold")
same=$(python3 - "$run" <<'EOF'
import json, sys
def answers(name):
    return {r["question"]: r["token_ids"] for r in map(json.loads, open(f"{sys.argv[1]}/{name}.jsonl"))}
e, c, n = answers("embedded"), answers("cached"), answers("cold")
print(f"{sum(e[q] == c[q] == n[q] for q in e)} of {len(e)}")
EOF
)
echo "| form | wall time | against the server without a cache |"
echo "|---|---|---|"
python3 - "$t_cold" "$t_cached" "$t_embedded" <<'EOF'
import sys
cold, cached, embedded = map(float, sys.argv[1:])
print(f"| `batch --server`, no prefix cache | {cold:.1f} s | 1.00x |")
print(f"| `batch --server`, prefix cache | {cached:.1f} s | **{cold / cached:.2f}x** |")
print(f"| `batch --model` (embedded, forks) | {embedded:.1f} s | {cold / embedded:.2f}x |")
EOF
echo
echo "Same greedy tokens in all three: $same."

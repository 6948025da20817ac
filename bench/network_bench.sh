#!/usr/bin/env bash
# Two pipeline stages on two hosts joined by a cluster's network, on one
# machine (as root): each host a network namespace with its own hostname,
# one MPI rank and one thread each, ranks started through
# tests/multihost/netns_agent.sh, Open MPI's TCP transport only. Per link
# and per stage-boundary dtype (f32, bf16), on k3-small: prefill of a
# T-token prompt in chunks (score: time, speedup over one process against
# the ideal 2.0), generate's time to first token and decode tokens/s for a
# 64-token prompt (the best of three runs), and the bytes the first host
# sent over its link during the prefill.
#
#   bash bench/network_bench.sh [T] [chunk] [new tokens]   (default 4096 512 64)
#
# LINKS lists the links, each `local` (both ranks on this host, as
# bench/pipeline_bench.sh runs them: shared memory, no network), `veth` (two
# hosts on a kernel veth pair: this machine's own latency and bandwidth) or
# `DELAY_US:RATE_MBIT` (two hosts on a build/bin/link_emulator link: one-way
# delay and rate, frames held in user space, since this kernel has no
# netem); default "local veth 200:1000 1000:100". The emulator's ceiling on
# a 2-core machine is about 3 Gbit/s; its report (how late frames left) is
# printed after each link's rows.
set -euo pipefail
# --help: the comment above.
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n '2,/^set /{s/^# \{0,1\}//p}' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
T=${1:-4096}
chunk=${2:-512}
new_tokens=${3:-64}
read -ra links <<<"${LINKS:-local veth 200:1000 1000:100}"
bin_dir=${BIN_DIR:-build/bin}  # BIN_DIR: another build to measure
bin=$bin_dir/deltaserve
model=${MODEL:-/tmp/deltaserve_bench_k3_small}
((EUID == 0)) || { echo "network_bench: needs root (network namespaces)" >&2; exit 1; }
[[ -f $model/model.safetensors ]] || $bin make-model --preset k3-small --out "$model" --seed 1 2>/dev/null

tag=$$
work=$(mktemp -d)
hosts=$work/hosts
emulator=
cleanup() {
  [[ -n $emulator ]] && kill "$emulator" 2>/dev/null && wait "$emulator" 2>/dev/null
  for i in 0 1; do
    ip netns pids "dsn$tag-$i" 2>/dev/null | xargs -r kill -9
    ip netns del "dsn$tag-$i" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
awk -v n="$T" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%d ", int(rand() * 256) }' \
  > "$work/tokens"
prompt=$(awk 'BEGIN { srand(2); for (i = 0; i < 64; i++) printf "%s%d", i ? "," : "", int(rand() * 256) }')

# link SPEC: hosts dsn<tag>-0 and -1 (10.214.0.1 and .2, hostnames nethost0
# and nethost1), their eth0 joined by SPEC.
link() {
  local i
  [[ $1 == local ]] && return
  for i in 0 1; do ip netns add "dsn$tag-$i"; done
  if [[ $1 == veth ]]; then
    ip link add dsn${tag}a type veth peer name dsn${tag}b
  else
    "$bin_dir/link_emulator" dsn${tag}a dsn${tag}b "${1%%:*}" "${1##*:}" > "$work/emulator" 2>&1 &
    emulator=$!
    until grep -q ready "$work/emulator"; do
      kill -0 "$emulator" 2>/dev/null || { cat "$work/emulator" >&2; exit 1; }
      sleep 0.05
    done
  fi
  : > "$hosts"
  for i in 0 1; do
    local dev=dsn${tag}a in="ip netns exec dsn$tag-$i"
    ((i == 0)) || dev=dsn${tag}b
    ip link set "$dev" netns "dsn$tag-$i"
    $in ip link set "$dev" name eth0
    $in ip link set eth0 mtu 9000
    $in ip addr add "10.214.0.$((i + 1))/24" dev eth0
    $in ip link set eth0 up
    $in ip link set lo up
    echo "10.214.0.$((i + 1)) dsn$tag-$i nethost$i" >> "$hosts"
  done
}
unlink() {
  [[ $1 == local ]] && return
  if [[ -n $emulator ]]; then
    kill "$emulator"
    wait "$emulator" || true
    emulator=
    sed 's/^/    emulator: /' "$work/emulator"
  fi
  for i in 0 1; do ip netns del "dsn$tag-$i"; done
}
sent() {
  if [[ $spec == local ]]; then echo 0; return; fi
  ip netns exec "dsn$tag-0" cat /sys/class/net/eth0/statistics/tx_bytes
}
# on_pair COMMAND...: COMMAND's two ranks, one on each host. --bind-to none:
# each host's Open MPI daemon sees the machine's cores as its own and would
# bind both ranks to core 0.
on_pair() {
  if [[ $spec == local ]]; then
    OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to core "$@"
    return
  fi
  DELTASERVE_TEST_HOSTS=$hosts OMP_NUM_THREADS=1 ip netns exec "dsn$tag-0" unshare --uts \
    sh -c 'hostname nethost0 && exec "$@"' sh \
    mpirun --allow-run-as-root --oversubscribe \
    --mca plm_rsh_agent "$PWD/tests/multihost/netns_agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    --bind-to none -np 2 --host 10.214.0.1:1,10.214.0.2:1 "$@"
}
score_seconds() { sed -n 's/^score: .* in \([0-9.]*\) s.*/\1/p'; }
generate_stats() {  # "TTFT_MS DECODE_TOKENS_PER_S"
  sed -n 's/.*time to first token: \([0-9.]*\) ms.*decode: \([0-9.]*\) tokens\/s.*/\1 \2/p' | tail -1
}
# best_of_3 COMMAND...: generate's stats, the best of three runs (the
# fastest first token, the fastest decode): a short run on a shared machine
# is easily slowed by something else.
best_of_3() {
  for _ in 1 2 3; do "$@" 2>&1 >/dev/null | generate_stats; done |
    sort -n -k1,1 | awk 'NR == 1 { t = $1 } { if ($2 > d) d = $2 } END { print t, d }'
}

score=(score --threads 1 --model "$model" --tokens-file "$work/tokens" --prefill-chunk "$chunk"
  --logits-out "$work/logits.safetensors" --stats)
generate=(generate --threads 1 --model "$model" --tokens "$prompt" --max-tokens "$new_tokens")
one=$(OMP_NUM_THREADS=1 $bin "${score[@]}" 2>&1 | score_seconds)
read -r one_ttft one_decode < <(OMP_NUM_THREADS=1 best_of_3 $bin "${generate[@]}")
echo "One process, one thread: prefill of $T tokens ${one} s; generate: time to first token" \
  "${one_ttft} ms, decode ${one_decode} tokens/s."
echo
echo "| link | boundary | prefill s | speedup (ideal 2.0) | host 0 sent | bytes/token | time to first token | decode tokens/s |"
echo "|---|---|---|---|---|---|---|---|"
for spec in "${links[@]}"; do
  link "$spec"
  for dtype in f32 bf16; do
    before=$(sent)
    two=$(on_pair $bin "${score[@]}" --pp 2 --boundary-dtype "$dtype" 2>&1 | score_seconds)
    bytes=$(($(sent) - before))
    read -r ttft decode < <(best_of_3 on_pair $bin "${generate[@]}" --pp 2 --boundary-dtype "$dtype")
    awk -v spec="$spec" -v dtype="$dtype" -v one="$one" -v two="$two" -v bytes="$bytes" \
      -v T="$T" -v ttft="$ttft" -v decode="$decode" 'BEGIN {
        sent = sprintf("%.1f MB | %.0f", bytes / 1e6, bytes / T)
        if (spec == "local") sent = "(shared memory) | -"
        printf "| %s | %s | %.2f | %.2fx | %s | %.1f ms | %.1f |\n",
          spec, dtype, two, one / two, sent, ttft, decode }'
  done
  unlink "$spec"
done

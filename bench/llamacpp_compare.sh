#!/usr/bin/env bash
# deltaserve against llama.cpp on the same machine, the same model, the same
# stored dtype (bf16, or MXFP4 routed experts with the rest bf16) and the same
# thread count, in one run: prefill tokens/s at 512, 2048 and 8192 tokens and
# decode tokens/s (and deltaserve's decode of batches). docs/llamacpp.md has
# the method, the figures and what could not be compared.
#
#   bash bench/llamacpp_compare.sh [--threads 2] [--deltaserve-build build]
#        [--model DIR | --preset k3-small [--experts bf16|mxfp4]]
#        [--prompts 512,2048,8192] [--decode 64] [--depth 128]
#        [--decode-batch 1[,8,32]] [--reps 1] [--rounds 3] [--quiet-max 10]
#        [--quiet-wait 1200] [--max-rel-l2 1e-3] [--goldens DIR]
#        [--compute-dtype f32|bf16] [--setup-only]
#
# --compute-dtype: deltaserve's GEMM precision on the bf16 weights (default
# f32, exact; bf16 rounds activations to bf16 for oneDNN's bf16 matmul, the
# precision class of llama.cpp's bf16 matmuls, which round them too).
#
# --model: a checkpoint of either architecture; without it, a random model of
# --preset (default k3-small; or k3-moe-small, K3's 128 experts with 8 active)
# with --experts bf16 (default) or mxfp4, made once in the cache. --goldens
# DIR: also run llama.cpp on every DIR/*/ holding expected_logits.safetensors
# (../shared/golden/model) and print its error against those float64 logits.
# --decode-batch: the decode batches model_bench times for deltaserve, 1 among
# them (default 1; 1,8,32 for an MXFP4 model); llama-bench times batch 1
# only. Before each timed command the script waits until the machine is quiet
# (other work under --quiet-max percent of the CPU over 3 s; at most
# --quiet-wait seconds in all, then it warns).
#
# Setup is idempotent and lives outside the repository, in
# ${DELTASERVE_LLAMACPP_DIR:-$HOME/.cache/deltaserve/llama.cpp}: the
# llama-cpp-python 0.3.36 sdist from PyPI (it vendors llama.cpp; none of
# llama.cpp is committed here), a CPU build of llama-bench and libllama
# (JOBS=2 parallel jobs), a venv for llama.cpp's converter and the float64
# reference (torch, transformers, numpy), the model's GGUFs (--outtype bf16
# and f32; MXFP4 experts stay MXFP4 in both) and bench/llamacpp_logits.cpp
# built against that libllama. Each step runs only when its output is missing.
#
# Before timing, the same 64 random token ids go through `deltaserve score`
# and through llama.cpp. A bf16 model: the f32 GGUF's logits must agree with
# deltaserve's to --max-rel-l2 (relative L2 over all logits) and the bf16 GGUF
# must hold the same values; the bf16 GGUF's logits and both greedy
# continuations are printed. An MXFP4 model (quantization_config in
# config.json): llama.cpp's MXFP4 matmul quantizes the activations to Q8_0,
# so the two do not compute the same numbers; instead both are measured
# against the float64 logits of tools/reference/kimi_reference.py: deltaserve's
# must be within --max-rel-l2 of them, llama.cpp's errors (both GGUFs) and
# argmax agreement are printed, and every MXFP4 tensor of the GGUF must hold
# the checkpoint's expert values. The script stops (exit 1) when a check fails
# or anything is missing: it never prints a number it did not measure.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DELTASERVE_LLAMACPP_DIR:-$HOME/.cache/deltaserve/llama.cpp}
version=0.3.36  # llama-cpp-python; vendors llama.cpp 0c1e57098 (ggml 0.25.3)
threads=2
ds_build=$repo/build
model=
preset=k3-small
experts=bf16
decode_batch=
prompts=512,2048,8192
decode=64
depth=128
reps=1
rounds=3
quiet_max=10
quiet_wait=1200
max_rel_l2=1e-3
goldens=
compute=f32
setup_only=0
jobs=${JOBS:-2}

usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
  echo "llamacpp_compare: $*" >&2
  exit 1
}

bad_usage() {
  usage >&2
  echo "llamacpp_compare: $*" >&2
  exit 2
}
# The absolute path of folder $2, the value of flag $1.
folder() { [[ -d $2 ]] || die "$1 $2: no such folder"; (cd "$2" && pwd); }

while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --setup-only) setup_only=1; shift; continue ;;
    --threads | --deltaserve-build | --model | --preset | --experts | --prompts | --decode | \
      --depth | --decode-batch | --reps | --rounds | --quiet-max | --quiet-wait | --max-rel-l2 | \
      --goldens | --compute-dtype)
      (($# >= 2)) || bad_usage "$1 needs a value" ;;
    *) bad_usage "unknown argument $1" ;;
  esac
  case $1 in
    --threads) threads=$2 ;;
    --deltaserve-build) ds_build=$(folder "$1" "$2") ;;
    --model) model=$(folder "$1" "$2") ;;
    --preset) preset=$2 ;;
    --experts)
      [[ $2 == bf16 || $2 == mxfp4 ]] || bad_usage "--experts must be bf16 or mxfp4"
      experts=$2 ;;
    --decode-batch)
      [[ ,$2, =~ ^(,[1-9][0-9]*)+,$ && ,$2, == *,1,* ]] ||
        bad_usage "--decode-batch must be a comma-separated list of batch sizes with 1 among them"
      decode_batch=$2 ;;
    --prompts) prompts=$2 ;;
    --decode) decode=$2 ;;
    --depth) depth=$2 ;;
    --reps) reps=$2 ;;
    --rounds) rounds=$2 ;;
    --quiet-max) quiet_max=$2 ;;
    --quiet-wait) quiet_wait=$2 ;;
    --max-rel-l2) max_rel_l2=$2 ;;
    --goldens) goldens=$(folder "$1" "$2") ;;
    --compute-dtype)
      [[ $2 == f32 || $2 == bf16 ]] || bad_usage "--compute-dtype must be f32 or bf16"
      compute=$2 ;;
  esac
  shift 2
done

for tool in python3 cmake c++ tar; do
  command -v "$tool" >/dev/null || die "$tool not found (needed to build llama.cpp)"
done
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

ds=$ds_build/bin/deltaserve
model_bench=$ds_build/bin/model_bench
[[ -x $ds && -x $model_bench ]] ||
  die "no $ds or $model_bench: build deltaserve first (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && ninja -C build deltaserve model_bench)"

mkdir -p "$cache"
log=$cache/logs
mkdir -p "$log"
step() { echo "== $*" >&2; }
# Runs a setup command with its output in $log/$1.log, shown when it fails.
quiet() {
  local name=$1
  shift
  if ! "$@" >"$log/$name.log" 2>&1; then
    tail -30 "$log/$name.log" >&2
    die "$name failed (full log: $log/$name.log)"
  fi
}

# --- llama.cpp source, from the llama-cpp-python sdist ---------------------
sdist=$cache/sdist/llama_cpp_python-$version.tar.gz
src_root=$cache/src/llama_cpp_python-$version
src=$src_root/vendor/llama.cpp
if [[ ! -f $sdist ]]; then
  step "downloading llama-cpp-python $version (sdist) from PyPI"
  quiet pip-download python3 -m pip download --no-binary :all: --no-deps \
    "llama-cpp-python==$version" -d "$cache/sdist"
fi
if [[ ! -f $src/convert_hf_to_gguf.py ]]; then
  step "unpacking $sdist"
  mkdir -p "$cache/src"
  tar xzf "$sdist" -C "$cache/src"
  [[ -f $src/convert_hf_to_gguf.py ]] || die "$sdist has no vendor/llama.cpp/convert_hf_to_gguf.py"
fi

# --- llama.cpp CPU build: llama-bench and libllama ---------------------------
lbuild=$cache/build
llama_bench=$lbuild/bin/llama-bench
if [[ ! -x $llama_bench ]]; then
  step "building llama.cpp (Release, GGML_NATIVE, CPU only; -j$jobs) in $lbuild"
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  quiet llama-cmake cmake -S "$src" -B "$lbuild" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF \
    "${launcher[@]}"
  quiet llama-build nice -n 10 cmake --build "$lbuild" --target llama-bench -j "$jobs"
  [[ -x $llama_bench ]] || die "the llama.cpp build made no $llama_bench"
fi
logits_bin=$cache/llamacpp_logits
if [[ ! -x $logits_bin || $repo/bench/llamacpp_logits.cpp -nt $logits_bin ]]; then
  step "building bench/llamacpp_logits.cpp against $lbuild/bin/libllama.so"
  quiet llamacpp-logits c++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" \
    "$repo/bench/llamacpp_logits.cpp" -o "$logits_bin" -L"$lbuild/bin" -lllama \
    -Wl,-rpath,"$lbuild/bin"
fi

# --- venv for llama.cpp's converter and the logits check ---------------------
venv=$cache/venv
py=$venv/bin/python
if [[ ! -f $venv/.deltaserve-ready ]]; then
  step "making the converter's venv in $venv (torch, transformers, numpy, safetensors)"
  quiet venv python3 -m venv "$venv"
  # transformers as llama.cpp's requirements pin it; torch 2.15.0 (the one
  # this was run with) from PyPI, as the CPU index those requirements name is
  # not reachable everywhere: PyPI's Linux wheel is the CUDA build, ~5 GB.
  quiet venv-pip "$py" -m pip install torch==2.15.0 transformers==4.57.6 numpy safetensors \
    sentencepiece "protobuf>=4.21,<5" pyyaml tqdm requests
  touch "$venv/.deltaserve-ready"
fi

# --- the model and its GGUFs ------------------------------------------------
if [[ -z $model ]]; then
  model=$cache/models/$preset
  [[ $experts == mxfp4 ]] && model+=-mxfp4
  if [[ ! -f $model/model.safetensors ]]; then
    what=$preset
    [[ $experts == mxfp4 ]] && what+=" with MXFP4 experts"
    step "making a random $what (seed 0) in $model"
    # Made aside and moved in whole, so that an interrupted run leaves no
    # half-written model behind.
    rm -rf "$model.tmp"
    quiet make-model "$ds" make-model --preset "$preset" --experts "$experts" --out "$model.tmp"
    rm -rf "$model"
    mv "$model.tmp" "$model"
  fi
elif [[ $preset != k3-small || $experts != bf16 ]]; then
  bad_usage "--preset and --experts choose the model to make: not with --model"
fi
# MXFP4 routed experts: config.json's quantization_config (K3: in text_config)
# names compressed-tensors' MXFP4 format, as real K3 and make-model --experts
# mxfp4 write it.
mxfp4=$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
q = c.get("quantization_config") or c.get("text_config", {}).get("quantization_config") or {}
print(int(q.get("format") == "mxfp4-pack-quantized"))' "$model/config.json") ||
  die "$model/config.json: not readable as JSON"
if [[ -z $decode_batch ]]; then
  decode_batch=1
  ((mxfp4)) && decode_batch=1,8,32
fi
# Converts checkpoint $1 to $cache/gguf/<name>-<path hash>-$2.gguf (echoed),
# again when the checkpoint is newer than the GGUF.
convert() {
  local dir=$1 type=$2 out
  [[ -f $dir/config.json ]] || die "$dir has no config.json"
  compgen -G "$dir/*.safetensors" >/dev/null || die "$dir has no *.safetensors"
  out=$cache/gguf/$(basename "$dir")-$(printf '%s' "$dir" | sha1sum | cut -c1-10)-$type.gguf
  if [[ ! -f $out || -n $(find "$dir" -maxdepth 1 -newer "$out" \( -name '*.safetensors' -o -name config.json \)) ]]; then
    step "converting $dir to $out (llama.cpp's convert_hf_to_gguf.py --outtype $type)"
    mkdir -p "$cache/gguf"
    quiet "convert-$(basename "$dir")-$type" "$py" "$repo/bench/llamacpp_convert.py" "$src" "$dir" \
      --outfile "$out.tmp" --outtype "$type"
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}
gguf=$(convert "$model" bf16)
gguf_f32=$(convert "$model" f32)

# --- optional: llama.cpp against the float64 golden logits -------------------
if [[ -n $goldens ]]; then
  for dir in "$goldens"/*/; do
    dir=${dir%/}
    [[ -f $dir/expected_logits.safetensors ]] || continue
    g=$(convert "$dir" f32)
    gids=$("$py" -c 'import sys; from safetensors.numpy import load_file; print(",".join(map(str, load_file(sys.argv[1])["tokens"])))' "$dir/expected_logits.safetensors")
    for how in "defaults:" "f32 cache, no flash attention:--f32-cache --no-flash-attn"; do
      for mode in "prefill:" "decode:--decode-from 1"; do
        # shellcheck disable=SC2086  # the flags are words
        quiet golden-logits "$logits_bin" "$g" "$gids" "$cache/golden.f32" --threads "$threads" \
          ${how#*:} ${mode#*:}
        "$py" "$repo/bench/llamacpp_check.py" logits "$dir/expected_logits.safetensors" \
          "$cache/golden.f32" --label "golden $(basename "$dir"), --outtype f32, ${how%%:*}, ${mode%%:*}"
      done
    done
  done
fi
((setup_only)) && { echo "setup done: $cache"; exit 0; }

# --- the check before timing: same token ids through both --------------------
check=$cache/check
mkdir -p "$check"
ids=$("$py" -c 'import random; r = random.Random(0); print(",".join(str(r.randrange(256)) for _ in range(64)))')
if ((mxfp4)); then
  step "checking both against the float64 reference: 64 token ids (tools/reference/kimi_reference.py)"
else
  step "checking the conversion: 64 token ids through both"
fi
quiet ds-score "$ds" score --model "$model" --threads "$threads" --tokens "$ids" \
  --logits-out "$check/deltaserve.safetensors"
for type in f32 bf16; do
  g=$gguf_f32
  [[ $type == bf16 ]] && g=$gguf
  quiet "llama-logits-$type" "$logits_bin" "$g" "$ids" "$check/llamacpp-$type.f32" \
    --threads "$threads" --generate 16
done
checks=()
if ((mxfp4)); then
  # MXFP4 experts: ggml's MXFP4 matmul quantizes the activations to Q8_0
  # (vec_dot_type in ggml-cpu.c), deltaserve multiplies the dequantized
  # experts in float32, so the two are not expected to agree with each other;
  # each is measured against the float64 reference instead. deltaserve's
  # error is bounded (it computes the reference's arithmetic in float32),
  # llama.cpp's is printed.
  quiet reference "$py" "$repo/bench/llamacpp_check.py" reference "$model" "$ids" \
    "$check/reference.safetensors"
  checks+=("$("$py" "$repo/bench/llamacpp_check.py" logits "$check/reference.safetensors" \
    "$check/deltaserve.safetensors" --max-rel-l2 "$max_rel_l2" \
    --label "deltaserve vs float64 reference, 64 tokens")") || {
    printf '%s\n' "${checks[@]}" >&2
    die "deltaserve's logits differ from the float64 reference's beyond --max-rel-l2 $max_rel_l2"
  }
  for type in bf16 f32; do
    checks+=("$("$py" "$repo/bench/llamacpp_check.py" logits "$check/reference.safetensors" \
      "$check/llamacpp-$type.f32" --label "llama.cpp $type GGUF vs float64 reference, 64 tokens")") ||
      die "llama.cpp's logits ($type GGUF) could not be compared"
  done
  checks+=("$("$py" "$repo/bench/llamacpp_check.py" logits "$check/deltaserve.safetensors" \
    "$check/llamacpp-bf16.f32" --label "llama.cpp bf16 GGUF vs deltaserve, 64 tokens")") ||
    die "llama.cpp's logits (bf16 GGUF) could not be compared"
  checks+=("$("$py" "$repo/bench/llamacpp_check.py" experts "$src/gguf-py" "$gguf" "$model")") ||
    die "the bf16 GGUF's MXFP4 experts do not hold the checkpoint's values"
else
  # The f32 GGUF must give deltaserve's logits (the graph and the conversion),
  # and the bf16 GGUF timed below must hold the same values as the f32 one.
  # The bf16 GGUF's own logits are printed, not gated: ggml rounds the
  # activations of a bf16 matmul to bf16, so they differ by more
  # (docs/llamacpp.md).
  for type in f32 bf16; do
    limit=inf
    [[ $type == f32 ]] && limit=$max_rel_l2
    checks+=("$("$py" "$repo/bench/llamacpp_check.py" logits "$check/deltaserve.safetensors" \
      "$check/llamacpp-$type.f32" --max-rel-l2 "$limit" --label "llama.cpp $type GGUF vs deltaserve, 64 tokens")") || {
      printf '%s\n' "${checks[@]}" >&2
      die "llama.cpp's logits (f32 GGUF) differ from deltaserve's beyond --max-rel-l2 $max_rel_l2: not timing different computations"
    }
  done
fi
checks+=("$("$py" "$repo/bench/llamacpp_check.py" weights "$src/gguf-py" "$gguf" "$gguf_f32")") ||
  die "the bf16 GGUF does not hold the f32 GGUF's values"
ds_gen=$("$ds" generate --model "$model" --threads "$threads" --tokens "$ids" --ids \
  --max-tokens 16 --ignore-eos 2>/dev/null | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
printf '%s\n' "${checks[@]}"
echo "greedy 16 tokens, deltaserve:          $ds_gen"
for type in f32 bf16; do
  echo "greedy 16 tokens, llama.cpp $type GGUF: $(sed -n 's/^generated: //p' "$log/llama-logits-$type.log")"
done

# --- timing -------------------------------------------------------------
# llama-bench warms up before each test (its default); model_bench does not,
# so its first prompt is run twice and the first row dropped. --rounds N runs
# the three commands in turn N times and keeps each figure's best: on a
# shared machine a slow round is other load, not the program.
cmd_pp=("$llama_bench" -m "$gguf" -t "$threads" -p "$prompts" -n 0 -r "$reps" -o json)
cmd_tg=("$llama_bench" -m "$gguf" -t "$threads" -p 0 -n "$decode" -d "$depth" -r "$reps" -o json)
first=${prompts%%,*}
cmd_ds=("$model_bench" --model "$model" --threads "$threads" --prompts "$first,$prompts"
  --decode "$decode" --compute-dtype "$compute")
[[ $decode_batch == 1 ]] || cmd_ds+=(--decode-batch "$decode_batch")
((depth == 128)) || echo "note: model_bench decodes after a 128-token prompt; llama-bench after --depth $depth" >&2

# Runs "${@:2}" with its stdout in $1.out and stderr in $1.log.
timed() {
  local out=$1
  shift
  "$@" >"$out.out" 2>"$out.log" || { tail -20 "$out.log" >&2; die "$* failed"; }
}
# Percent of all CPU time busy over 3 s (/proc/stat), while nothing of ours runs.
busy_percent() {
  local a b busy idle
  read -ra a </proc/stat
  sleep 3
  read -ra b </proc/stat
  busy=$((b[1] + b[2] + b[3] + b[6] + b[7] + b[8] - a[1] - a[2] - a[3] - a[6] - a[7] - a[8]))
  idle=$((b[4] + b[5] - a[4] - a[5]))
  echo $((100 * busy / (busy + idle + 1)))
}
# Waits until other load is at most --quiet-max percent, for --quiet-wait
# seconds in all over the run; then measures anyway, and says so.
wait_deadline=$((SECONDS + quiet_wait))
other_load=()
wait_quiet() {
  local pct
  while pct=$(busy_percent) && ((pct > quiet_max)); do
    if ((SECONDS >= wait_deadline)); then
      echo "warning: the machine is ${pct}% busy with other work; measuring anyway" >&2
      break
    fi
  done
  other_load+=("$pct%")
}
results=()
for ((round = 1; round <= rounds; round++)); do
  step "round $round/$rounds"
  wait_quiet
  timed "$log/pp-$round" "${cmd_pp[@]}"
  wait_quiet
  timed "$log/tg-$round" "${cmd_tg[@]}"
  wait_quiet
  timed "$log/ds-$round" "${cmd_ds[@]}"
  results+=("$log/pp-$round.out" "$log/tg-$round.out" "$log/ds-$round.out")
done
weights="bf16 weights"
((mxfp4)) && weights="MXFP4 experts, rest bf16"
"$py" "$repo/bench/llamacpp_check.py" table --prompts "$prompts" --decode "$decode" \
  --depth "$depth" --threads "$threads" --weights "$weights" --decode-batch "$decode_batch" \
  "${results[@]}"

echo
echo "other CPU load over 3 s before each command (llama.cpp prefill, decode, deltaserve; each round): ${other_load[*]}"
echo "commands (each round):"
echo "  ${cmd_pp[*]}"
echo "  ${cmd_tg[*]}"
echo "  ${cmd_ds[*]}"
echo "llama.cpp: llama-cpp-python $version sdist, vendor/llama.cpp $(sed -n 's/.*llama.cpp@\([0-9a-f]*\).*/\1/p' "$src_root/CHANGELOG.md" | head -1); build: $lbuild"
echo "deltaserve: $ds_build ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'))"

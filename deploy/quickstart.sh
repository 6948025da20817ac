#!/usr/bin/env bash
# The README's first command: set up, build, make a tiny random K3 model and
# stream a generation from it with timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh
model=build/models/k3-tiny
[[ -f $model/model.safetensors ]] || build/bin/deltaserve make-model --preset k3-tiny --out "$model" --seed 1
build/bin/deltaserve generate --model "$model" --prompt "Kimi Delta Attention " \
  --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 7

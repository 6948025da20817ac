#!/usr/bin/env bash
# The README's first command: set up, build, make a tiny random K3 model, start
# the embedded server on it (`deltaserve serve`: the gRPC API and a one-process
# worker), stream a generation through the C++ client with its timings, and
# stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
# The programs only: the test suite (and what it needs installed) is deploy/test.sh's.
bash deploy/build.sh -DDELTASERVE_TESTS=OFF
model=build/models/k3-tiny
[[ -f $model/model.safetensors ]] || build/bin/deltaserve make-model --preset k3-tiny --out "$model" --seed 1

run=$(mktemp -d)
server=
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$run"' EXIT
source deploy/serve_lib.sh
start_serve "$model" "$run"
echo "deltaserve serve is listening on $address; streaming a request:" >&2
build/bin/deltaserve client generate --server "$address" --prompt "Kimi Delta Attention " \
  --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 7

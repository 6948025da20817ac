#!/usr/bin/env bash
# The README's first command: set up, build, start the embedded server
# (`deltaserve serve`: the gRPC API and a one-process worker) on the small
# trained K3 model in models/k3-mini-kjv, stream a continuation of a prompt
# through the C++ client with its timings, and stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
# The programs only: the test suite (and what it needs installed) is deploy/test.sh's.
bash deploy/build.sh -DDELTASERVE_TESTS=OFF
# A tiny demonstration model (7M parameters) trained on the King James Bible:
# its README says how, and how well it does.
model=models/k3-mini-kjv

run=$(mktemp -d)
server=
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$run"' EXIT
source deploy/serve_lib.sh
start_serve "$model" "$run"
echo "deltaserve serve is listening on $address with k3-mini-kjv, a tiny demonstration model" >&2
echo "(a Kimi K3 of 7M parameters trained for an hour on the King James Bible: it writes" >&2
prompt="And God said unto Noah,"
echo "plausible KJV-style verses, not sense). Streaming a continuation of \"$prompt\":" >&2
build/bin/deltaserve client generate --server "$address" --prompt "$prompt" \
  --max-tokens 64 --temperature 0.7 --top-p 0.9 --seed 7

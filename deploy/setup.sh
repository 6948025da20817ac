#!/usr/bin/env bash
# Installs the Debian 12 packages deltaserve builds and runs with, only those
# missing; with --test, also those its test suite needs (deploy/test.sh passes
# it). Run as root (or with sudo) on a fresh machine; safe to re-run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  python3                  # the build's include check (tools/check_layers.py)
  libdnnl-dev              # oneDNN: sgemm for the GEMMs of many rows (docs/architecture.md)
  libabsl-dev              # absl::Status / StatusOr, strings
  nlohmann-json3-dev       # config.json and safetensors headers
  libopenmpi-dev openmpi-bin  # DELTASERVE_MPI (default ON)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # serving API
  libssl-dev               # TLS, terminated by the HTTP/2 guard of the gRPC ports
  libboost-dev             # Boost.Beast: the OpenAI HTTP API
  libonig-dev              # tokenizer pre-tokenization patterns
  libre2-dev               # quantization_config target patterns (also a gRPC dependency)
  python3-grpcio python3-protobuf  # the Python client example
)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(
    libgtest-dev             # DELTASERVE_TESTS
    python3-pip python3-setuptools  # the Python client installed as a package (serve_e2e_test)
    clang-format             # the format_check test (tools/check_format.sh)
    clang libomp-dev libclang-rt-dev  # deploy/sanitize.sh: ASan + UBSan and libFuzzer
    # The slurm tests start a one-node cluster of their own (tests/slurm/); the
    # mpi/pmix plugin that srun --mpi=pmix needs is in slurm-wlm-basic-plugins,
    # which slurmd brings. Without a slurm.conf in /etc/slurm the packages'
    # services do not start.
    munge slurmctld slurmd slurm-client
    # The multihost tests' hosts: network namespaces, veth links and a bridge
    # (ip), each host's hostname in a UTS namespace (unshare).
    iproute2 util-linux
  )
elif [[ $# -gt 0 ]]; then
  echo "usage: deploy/setup.sh [--test]" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ "${1:-}" == "--test" ]]; then
  # The OpenAI Python client, from PyPI (Debian has none), that the HTTP API's
  # tests drive the server with: into .cache/python-deps of this tree, where
  # they look for it, not into the system's Python.
  deps="$(cd "$(dirname "$0")/.." && pwd)/.cache/python-deps"
  openai_version="3.60.0"
  if ! PYTHONPATH="$deps" /usr/bin/python3 -c \
      "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
    echo "setup: installing openai==$openai_version into $deps"
    rm -rf "$deps"
    /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --target "$deps" "openai==$openai_version"
  fi
fi

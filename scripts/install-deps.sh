#!/usr/bin/env bash
# Installs what llamatrain needs from Debian 12 packages, only what is missing (idempotent, quick
# when everything is present). Run as root (or with sudo available).
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --bench  also Python 3 with numpy, torch, h5py, matplotlib (benchmarks, charts)
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config ccache git
          openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          libcli11-dev libsentencepiece-dev libopenblas-openmp-dev nlohmann-json3-dev
          libxxhash-dev xxhash  # XXH3 checkpoint checksums; xxhsum checks them (docs/formats.md)
          libdnnl-dev  # oneDNN 2.x: bf16 matrix products on the CPU (--precision bf16), opened with dlopen
          libgtest-dev libgmock-dev libbenchmark-dev
          clang libclang-rt-14-dev  # clang + libFuzzer: the fuzz tests of the model-file parsers
          slurmctld slurmd slurm-client munge)  # a private Slurm for tests/slurm (the test starts and stops it)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3 python3-numpy python3-torch python3-h5py python3-matplotlib)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

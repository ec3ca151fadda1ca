#!/usr/bin/env bash
# Installs the Debian packages seqpar needs to build, test and benchmark, if any is missing.
# Debian 12 (bookworm). Runs apt-get as root (or through sudo).
#   scripts/install-deps.sh        what make demo and make test need (make sanitize too: GCC's
#                                  sanitizer runtimes come with g++)
#   scripts/install-deps.sh fuzz   also clang and its libFuzzer runtime (make fuzz)
#   scripts/install-deps.sh ci     also ccache (.ci/run: rebuilds of unchanged files are cache hits;
#                                  the build never needs it)
set -euo pipefail

packages=(
  g++ cmake make pkg-config python3 python3-venv python3-pytest python3-dev pybind11-dev python3-mpi4py python3-numpy
  libdnnl-dev ocl-icd-opencl-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libbenchmark-dev
)
for group in "$@"; do
  case "$group" in
    fuzz) packages+=(clang libclang-rt-14-dev) ;;
    ci) packages+=(ccache) ;;
    *) echo "install-deps: unknown group '$group' (valid: fuzz, ci)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo_cmd=(sudo); else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

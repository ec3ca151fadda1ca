#!/usr/bin/env bash
# pip install . into a fresh virtual environment (scikit-build-core from PyPI, the library built
# by the project's CMake), then the installed module attends on 2 thread ranks from another
# folder. ctest python_pip_install (configure with -DSEQPAR_TEST_PIP=ON; it needs PyPI and a few
# minutes).
# usage: pip_install.sh SOURCE_DIR [PYTHON]
set -euo pipefail
src=$1 py=${2:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv --system-site-packages "$tmp/venv"
settings=()
command -v ccache >/dev/null &&
  settings=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1 "$tmp/venv/bin/pip" install -q "$src" "${settings[@]}"
cd "$tmp"
"$tmp/venv/bin/python" - <<'PY'
import numpy as np
import seqpar

assert seqpar.__file__.endswith("site-packages/seqpar/__init__.py"), seqpar.__file__
x = np.random.default_rng(0).standard_normal((1, 64, 2, 16)).astype(np.float32)
part = seqpar.Partition(64, 2)
out = part.unshard(seqpar.ThreadWorld(2).run(
    lambda c: seqpar.attention(*(part.shard(x, c.rank) for _ in range(3)), comm=c)))
xd = x.astype(np.float64)  # the reference in float64; measured max |err| 8e-7
s = np.einsum("bqhd,bkhd->bhqk", xd, xd) / 4.0
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), xd)
assert np.abs(out - ref).max() < 2e-6, np.abs(out - ref).max()
print("pip-installed seqpar", seqpar.version(), "ok")
PY

#!/usr/bin/env bash
# scripts/python-env.sh [DIR]: makes (or reuses) the virtual environment holding the test-only
# references (PyTorch, transformers, diffusers, safetensors: tests/python/requirements.txt) from
# PyPI, with Debian's python3 and its packages visible (python3-mpi4py, python3-pytest). DIR
# defaults to build/pyenv. Reused when DIR/.requirements equals the requirements file; prints the
# environment's python on the last line. pip's cache (PIP_CACHE_DIR or ~/.cache/pip) keeps the
# gigabytes of PyTorch's wheels for the next environment on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/pyenv}
REQ=tests/python/requirements.txt
PY=/usr/bin/python3

if [ -x "$DIR/bin/python" ] && cmp -s "$REQ" "$DIR/.requirements"; then
  echo "$DIR/bin/python"
  exit 0
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  bash scripts/install-deps.sh >&2
fi
rm -rf "$DIR"
"$PY" -m venv --system-site-packages "$DIR" >&2
echo "python-env: installing $(grep -v '^#' "$REQ" | tr '\n' ' ')into $DIR (PyTorch's wheels are large the first time)" >&2
"$DIR/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -r "$REQ" >&2
cp "$REQ" "$DIR/.requirements"
echo "$DIR/bin/python"

#!/usr/bin/env bash
# run_pytest.sh PYTHON SCRIPT: runs one test script with pytest in the references' environment,
# or fails in one line saying how to make that environment.
set -euo pipefail
py=$1 script=$2
if [ ! -x "$py" ]; then
  echo "no Python environment for the reference tests at $py: run scripts/python-env.sh (make test does)" >&2
  exit 1
fi
cd "$(dirname "$script")"
exec "$py" -m pytest -q -p no:cacheprovider "$(basename "$script")"

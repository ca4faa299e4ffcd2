#!/usr/bin/env bash
# Creates .venv-bench: the project plus TRL, the peer that bench/bench_trl.py measures against.
# TRL stays out of the main environment; it only serves the comparison. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-bench
PY=${PY:-python3}
STAMP=$VENV/.installed
if [ -f "$STAMP" ]; then
  echo "$VENV is ready"
  exit 0
fi
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --disable-pip-version-check)
# torch first, from the CPU wheel: anything unpinned would pull a multi-GB CUDA build.
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints.txt -e . trl
"$VENV/bin/python" -c "import trl; print('trl', trl.__version__)"
touch "$STAMP"
echo "$VENV is ready"

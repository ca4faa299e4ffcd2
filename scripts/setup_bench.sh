#!/usr/bin/env bash
# Creates .venv-bench: the project plus TRL, the peer that bench/bench_trl.py measures against.
# TRL stays out of the main environment; it only serves the comparison. Idempotent.
set -euo pipefail
source "$(dirname "$0")/side_venv.sh" .venv-bench
cpu_torch
pip_install -c constraints.txt -e . trl
"$VENV/bin/python" -c "import trl; print('trl', trl.__version__)"
finish

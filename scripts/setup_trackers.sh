#!/usr/bin/env bash
# Creates .venv-trackers: Trackio's environment, for `make test-trackers` (tests marked `trackers`).
#
# trackio 0.43 requires pillow<13, and requirements.lock pins pillow 13.0.0 (streamlit's), so it
# cannot join .venv; MLflow (the skinny client), W&B and TensorBoard install there cleanly (the
# `trackers` extra) and are tested in the normal suite. The Trackio tests need no torch: the sink
# and the fan-out on their own, against the real library, so this environment stays small.
# Keep the pin equal to pyproject's `trackio` extra. Idempotent: a finished environment is left alone.
set -euo pipefail
TRACKIO="trackio==0.43.0"
source "$(dirname "$0")/side_venv.sh" .venv-trackers "$TRACKIO" "$TRACKIO"
pip_install --quiet -c constraints.txt "$TRACKIO" "pytest>=8" "pytest-timeout>=2.3" "sqlalchemy>=2.0" "pandas>=2.2"
"$VENV/bin/python" -c "import trackio; print('trackio', trackio.__version__)"
finish

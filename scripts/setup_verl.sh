#!/usr/bin/env bash
# Creates .venv-verl: the reference implementations that tests/reference/ compares against.
#
# Only verl's source files are needed: its DAPO-Math grader (verl/utils/reward_score/math_dapo.py,
# which imports only `re` and `typing`) and its policy losses (verl/trainer/ppo/core_algos.py).
# The tests load them by path into the project's own environment, so verl is installed without
# its dependencies (Ray, tensordict, vLLM, ...), and nothing of it is imported as a package.
# Idempotent: a finished environment with the pinned version is left alone.
# TRL's GRPOTrainer file holds the loss variants TRL adds (luspo, vespo, the token filters):
# tests/reference/test_losses_vs_trl.py takes its functions out of it the same way.
VERL_VERSION=0.9.1
TRL_VERSION=1.16.0
set -euo pipefail
source "$(dirname "$0")/side_venv.sh" .venv-verl "$VERL_VERSION trl $TRL_VERSION" \
  "verl $VERL_VERSION, trl $TRL_VERSION"
pip_install --quiet --no-deps "verl==$VERL_VERSION" "trl==$TRL_VERSION"
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for f in verl/utils/reward_score/math_dapo.py verl/trainer/ppo/core_algos.py \
  verl/utils/torch_functional.py; do
  test -f "$SITE/$f" || { echo "verl $VERL_VERSION has no $f" >&2; exit 1; }
done
for f in trl/trainer/grpo_trainer.py; do
  test -f "$SITE/$f" || { echo "trl $TRL_VERSION has no $f" >&2; exit 1; }
done
finish

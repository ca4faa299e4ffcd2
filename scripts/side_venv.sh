# The steps every side environment shares (.venv-vllm, .venv-verl, .venv-bench), sourced by
# scripts/setup_*.sh (after set -euo pipefail):
#   source "$(dirname "$0")/side_venv.sh" VENV [VERSION [WHAT]]
#
# Moves to the repository root and ends the calling script at once (exit 0) when VENV is
# finished: its .installed stamp holds VERSION (default: nothing). Otherwise creates VENV with
# $PY (default python3) and defines what the script installs with:
#   pip_install ARGS...  `pip install ARGS` into VENV (scripts/venv_install.sh: uv, or pip)
#   cpu_torch            torch first, from the CPU wheel: anything unpinned would pull a
#                        multi-GB CUDA build
#   finish               writes the stamp and says "VENV is ready (WHAT)"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=$1
VERSION=${2:-}
READY="$VENV is ready${3:+ ($3)}"
STAMP=$VENV/.installed
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION" ]; then
  echo "$READY"
  exit 0
fi
test -x "$VENV/bin/python" || "${PY:-python3}" -m venv "$VENV"

pip_install() { bash scripts/venv_install.sh "$VENV" "$@"; }
cpu_torch() { pip_install torch==2.13.0; }
finish() {
  if [ -n "$VERSION" ]; then echo "$VERSION"; fi >"$STAMP"
  echo "$READY"
}

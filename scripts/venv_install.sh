#!/usr/bin/env bash
# `pip install ARGS...` into VENV, done by uv when uv can be had, by pip otherwise:
#   bash scripts/venv_install.sh VENV ARGS...
#
# uv installs the same pinned set (constraints.txt, requirements.lock) faster: the main
# environment in 72 s with its bytecode (1 min 22 s as CI's first stage, uv's own install
# included) against pip's 2.5-3.5 min on a 2-core machine (2026-11-29); CI builds four
# environments from nothing. uv reads neither pip's config nor its environment, so what
# pip would use is handed on: its find-links, index and extra indexes, global constraints and
# certificate bundle (`pip config list`). Any failure of uv falls back to pip with one line
# saying so; DAPO_NO_UV=1 uses pip from the start.
#
# Bytecode is compiled at install, as pip does: uv leaves it to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (CI's machines set it) no process ever writes it, so each
# one compiled torch and transformers from source again. `make test` took 36 min instead of
# 15 that way (2026-11-29).
set -euo pipefail
VENV=$1
shift
UV_VERSION=0.13.8
pip_cmd=("$VENV/bin/pip" install --disable-pip-version-check "$@")

if [ -z "${DAPO_NO_UV:-}" ] && { [ -x "$VENV/bin/uv" ] ||
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION" >/dev/null 2>&1; }; then
  args=(--python "$VENV/bin/python" --index-strategy unsafe-best-match)
  # `pip config list` prints key='value' lines, the environment's (:env:.) and the files'.
  while IFS= read -r line; do
    key=${line%%=*}
    key=${key##*.}
    value=${line#*=\'}
    value=${value%\'}
    for v in $value; do
      case $key in
        find-links) args+=(--find-links "$v") ;;
        index-url) args+=(--index-url "$v") ;;
        extra-index-url) args+=(--extra-index-url "$v") ;;
        constraint) [ -f "$v" ] && args+=(--constraint "$v") ;;
        cert) export SSL_CERT_FILE="$v" ;;
      esac
    done
  done < <("$VENV/bin/pip" config list 2>/dev/null)
  # The cache may sit on another disk than the venv: copy, without uv's warning about it.
  if UV_LINK_MODE=copy "$VENV/bin/uv" pip install --compile-bytecode "${args[@]}" "$@"; then
    exit 0
  fi
  echo "uv could not install into $VENV (above); installing with pip instead"
fi
"${pip_cmd[@]}"

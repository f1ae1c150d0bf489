#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs lint, types and tests.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
bash scripts/system-deps.sh  # Debian packages the tests use (redis-server, ...)
"$PY" -m ruff check .
"$PY" -m mypy
"$PY" -m pytest "$@"

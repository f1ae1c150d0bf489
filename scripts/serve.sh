#!/usr/bin/env bash
# Runs the session server: sets up the environment (scripts/setup.sh), then
# `worldserve serve` on 127.0.0.1:8000 unless told otherwise.
# Usage: bash scripts/serve.sh [--port N] [--host H] [any `worldserve serve` option]
#        HOST / PORT in the environment set the defaults too.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/worldserve" serve --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"

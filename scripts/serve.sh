#!/usr/bin/env bash
# Runs the session server: sets up the environment (scripts/setup.sh), then
# `worldserve serve`, on 127.0.0.1:8000 unless told otherwise.
# Usage: bash scripts/serve.sh [any `worldserve serve` option, e.g. --port 9000]
#        Every option is also an environment variable of the same name
#        (WORLDSERVE_PORT=9000, WORLDSERVE_HOST=0.0.0.0); an option wins over its variable.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/worldserve" serve "$@"

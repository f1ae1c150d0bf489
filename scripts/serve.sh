#!/usr/bin/env bash
# Installs everything on a fresh machine, then serves the embedded default model.
# Extra arguments go to `worldserve serve` (e.g. --port 8001).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/worldserve" serve "$@"

#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing; idempotent.
# Runs `apt-get update` only when something is missing. Needs root (or sudo) only then.
# Usage: scripts/system-deps.sh
set -euo pipefail

# One package a line; add new ones here (e.g. chromium for the browser tests).
PACKAGES=(
    redis-server  # tests/directory, tests/scaleout, `worldserve drill`: a real Redis
    chromium  # tests/browser: headless Chromium for the browser client (Playwright)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

echo "system-deps: installing ${missing[*]}" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "system-deps: need root to install ${missing[*]} (apt-get install ${missing[*]})" >&2
        exit 1
    fi
    SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

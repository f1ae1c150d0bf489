#!/usr/bin/env bash
# Creates or reuses the virtual environment .venv at the repository root and
# installs worldserve into it (editable, with the server and dev extras). Re-running is
# cheap: the install is skipped while pyproject.toml and this script are unchanged.
# Usage: source scripts/setup.sh   (sets ROOT and PY)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
if [ ! -x "$PY" ]; then
    python3 -m venv "$ROOT/.venv"
fi
stamp="$ROOT/.venv/.worldserve-$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    "$PY" -m pip install -q --upgrade pip
    # torch first and pinned: the CPU wheel of this release is on the machine's disk.
    "$PY" -m pip install -q "torch==2.13.0"
    "$PY" -m pip install -q -e "$ROOT[server,dev]"
    # The Wan family's reference implementation, for tests/model/wan only (the server never
    # imports it). Without its dependencies: it declares a whole training stack it does not need.
    "$PY" -m pip install -q --no-deps "streamdiffusionv2==0.1.1"
    # open-clip's ViT, the reference for tests/model/wan/test_clip.py; without its
    # dependencies: torchvision's build for this torch does not import on a CPU-only machine.
    "$PY" -m pip install -q --no-deps "open-clip-torch==3.3.0"
    rm -f "$ROOT"/.venv/.worldserve-*
    touch "$stamp"
fi
# mypy cannot follow setuptools' editable import hook: it reads the `worldserve` namespace
# from these links instead (pyproject.toml's mypy_path).
mkdir -p "$ROOT/.venv/typecheck/worldserve"
for pkg in cli protocol session server model clients bench training world; do
    ln -sfn "$ROOT/$pkg" "$ROOT/.venv/typecheck/worldserve/$pkg"
done
export ROOT PY

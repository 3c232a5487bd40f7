#!/usr/bin/env bash
# Create (or reuse) the project venv in .venv and install bpuemu into it.
#   scripts/setup_env.sh [EXTRA]      EXTRA: host (default) or test
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-host}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[${extra}]"

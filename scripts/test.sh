#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh test
exec .venv/bin/python -m pytest tests "$@"

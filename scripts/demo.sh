#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up, then convert a sample
# model, serve it from a local hrt_boardd on loopback, and run model_info,
# infer and perf against it.   Extra arguments go to bpuemu-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh host
exec .venv/bin/bpuemu-demo "$@"

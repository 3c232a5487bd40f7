#!/usr/bin/env bash
# Run each converted model on one evaluation sample: the float model and the quantized model on this host
# (HB_ONNXRuntime), the .bin on a board (hrt_model_exec infer --board). The board is a local hrt_boardd on
# loopback that this script starts and stops, unless BOARD=HOST:PORT names one.
set -e
cd "$(dirname "$0")"

python3 inference.py ${BOARD:+--board "$BOARD"} "$@"

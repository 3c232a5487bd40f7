#!/bin/sh
# The host half of the compose demo: make a tiny model, then drive the board
# service with it over gRPC: hrt_model_exec model_info, infer and perf with
# --board, and hb_verifier's three-way compare (quanti.onnx, the x86
# simulator in this container, and the board).
#
#   BPUEMU_BOARD        the board's HOST:PORT         (default board:9473)
#   BPUEMU_TOKEN_FILE   the board's token              (default /run/secrets/bpuemu_token)
#   BPUEMU_WORKDIR      where the model files go       (default a new temporary directory)
#   BPUEMU_SIZE         input height and width         (default 32)
#   BPUEMU_FRAMES       perf frame count               (default 20)
set -eu
board="${BPUEMU_BOARD:-board:9473}"
token_file="${BPUEMU_TOKEN_FILE:-/run/secrets/bpuemu_token}"
size="${BPUEMU_SIZE:-32}"
frames="${BPUEMU_FRAMES:-20}"
workdir="${BPUEMU_WORKDIR:-$(mktemp -d)}"
mkdir -p "$workdir"
cd "$workdir"

step() { printf '\n==> %s\n' "$*"; }

step "waiting for the board at $board"
tries=0
until python -m bpuemu.board.daemon.healthcheck --target "$board" --quiet 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
        python -m bpuemu.board.daemon.healthcheck --target "$board"
        exit 1
    fi
    sleep 1
done

step "building a ${size}x${size} sample model (sample.bin and its quanti.onnx)"
python - "$size" <<'PY'
import sys
from bpuemu.host.samples import sample_bin
size = int(sys.argv[1])
sha = sample_bin("sample.bin", height=size, width=size, quantized_path="quanti.onnx")
print(f"sample.bin sha256 {sha}")
PY

step "hrt_model_exec model_info on the board"
hrt_model_exec model_info --model_file sample.bin --board "$board" --token-file "$token_file"

step "hrt_model_exec infer on the board"
hrt_model_exec infer --model_file sample.bin --board "$board" --token-file "$token_file"

step "hrt_model_exec perf on the board"
hrt_model_exec perf --model_file sample.bin --board "$board" --token-file "$token_file" --frame_count "$frames"

step "hb_verifier: quanti.onnx vs x86 simulator vs board"
hb_verifier -m quanti.onnx,sample.bin -s True -b "grpc://$board" --token-file "$token_file"

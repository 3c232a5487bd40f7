#!/usr/bin/env bash
# Evaluate the three converted models on the evaluation split (data/evaluation) on their task metrics:
# the float and quantized ONNX on this host (HB_ONNXRuntime), the .bin on boards (bpuemu-ocr-eval).
# Boards: BOARD=HOST:PORT[,HOST:PORT...] or BOARD=@boards.txt spreads the images over them; without it,
# OCR_LOCAL_BOARDS (default 1) hrt_boardd on loopback, started and stopped by the command.
# Per-image results go to eval_results.jsonl (a re-run resumes from it), the metrics to eval_report.json.
set -e
cd "$(dirname "$0")"

if [ -n "${BOARD:-}" ]; then
  where=(--board "$BOARD")
else
  where=(--local-boards "${OCR_LOCAL_BOARDS:-1}")
fi
echo "== bpuemu-ocr-eval --data data/evaluation --model-dir model_output ${where[*]}"
bpuemu-ocr-eval --data data/evaluation --model-dir model_output "${where[@]}" \
  --results eval_results.jsonl --report eval_report.json "$@"

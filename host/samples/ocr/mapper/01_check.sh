#!/usr/bin/env bash
# Fetch the three PaddleOCR models into model/ and check each one for the X5 (hb_mapper checker).
# The detector is checked at OCR_DET_SIZE (HxW, default 640x640), the size 03_build.sh converts it at.
set -e
cd "$(dirname "$0")"
det_size=${OCR_DET_SIZE:-640x640}

bpuemu-samples models ocr model
check() {  # name, model file, input shape
  echo "== $1: hb_mapper checker --model model/$2 --input-shape x $3"
  hb_mapper checker --model-type onnx --march bayes-e --model "model/$2" --input-shape x "$3" \
    > "hb_mapper_checker_$1.log" 2>&1 || { cat "hb_mapper_checker_$1.log"; exit 1; }
  echo "   passed; the placement table is in hb_mapper_checker_$1.log"
}
check det ch_PP-OCRv4_det_infer.onnx "1x3x${det_size}"
check cls ch_ppocr_mobile_v2.0_cls_infer.onnx 1x3x48x192
check rec ch_PP-OCRv4_rec_infer.onnx 1x3x48x320

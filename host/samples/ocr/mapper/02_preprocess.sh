#!/usr/bin/env bash
# Labelled data and calibration files for the three OCR models.
#   ./02_preprocess.sh [--read_mode opencv|skimage]
# opencv reads BGR uint8 (0..255), skimage RGB float (0..1): preprocess.py's transformers follow the choice,
# and the calibration files come out the same. Data sizes: OCR_CAL_PAGES, OCR_CAL_LINES, OCR_EVAL_PAGES,
# OCR_EVAL_LINES, OCR_SEED; the detector's input size: OCR_DET_SIZE (HxW, default 640x640).
set -e
cd "$(dirname "$0")"

python3 preprocess.py "$@"

#!/usr/bin/env bash
# Convert the three models (hb_mapper makertbin with ppocr_{det,cls,rec}_config.yaml) into model_output/.
# With OCR_DET_SIZE (HxW) the detector is converted at that input size instead of 640x640
# (ppocr_det_HxW_config.yaml, written beside the original).
set -e
cd "$(dirname "$0")"
det_size=${OCR_DET_SIZE:-640x640}

det_config=ppocr_det_config.yaml
if [ "$det_size" != 640x640 ]; then
  det_config="ppocr_det_${det_size}_config.yaml"
  sed "s/1x3x640x640/1x3x${det_size}/" ppocr_det_config.yaml > "$det_config"
fi
for config in "$det_config" ppocr_cls_config.yaml ppocr_rec_config.yaml; do
  echo "== hb_mapper makertbin --config $config --model-type onnx"
  start=$(date +%s)
  hb_mapper makertbin --config "$config" --model-type onnx > makertbin.out 2>&1 || { cat makertbin.out; exit 1; }
  grep -E "INFO (output .*cosine similarity|Select )|WARNING output" makertbin.out | sed 's/^.* \(INFO\|WARNING\) /   /' || true
  echo "   done in $(( $(date +%s) - start )) s; log: hb_mapper_makertbin.log"
done
rm -f makertbin.out
ls -l model_output/*.bin

"""A real OCR pipeline as a conversion sample: PaddleOCR's PP-OCRv4 text detector, its text-direction
classifier and its PP-OCRv4 recogniser, with labelled synthetic data.

* ``models``: the three ONNX models from the ``rapidocr-onnxruntime`` wheel (fetched with pip, cached) and
  the recogniser's character list;
* ``dataset``: pages and text lines rendered with known strings, boxes and orientation over real photos,
  deterministic by seed, in calibration and evaluation splits;
* ``preprocess``: each model's input from an image (its float input and the ``.bin``'s input_type_rt bytes),
  on the one transforms module;
* ``postprocess``: DB box decoding, the direction classifier's answer, CTC greedy decoding;
* ``metrics``: the task metrics (detection P/R/H-mean, direction accuracy, recognition exact match and
  character accuracy, end-to-end text accuracy);
* ``evaluate``: float ONNX vs quantized ONNX vs the ``.bin`` on boards over the evaluation split
  (``bpuemu-ocr-eval``, the 05_evaluate step);
* ``mapper/``: the sample workflow, in the shape of the toolchain's conversion samples (01_check.sh,
  02_preprocess.sh, 03_build.sh, 04_inference.sh, 05_evaluate.sh, preprocess.py, postprocess.py, the three yaml configs); ``bpuemu-samples
  copy ocr DIR`` copies it out.
"""

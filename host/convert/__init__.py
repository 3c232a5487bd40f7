"""The stages of hb_mapper makertbin before quantization and after it.

``preprocess``: insert HzPreprocess -> *_original_float_model.onnx
``optimizer``: BN folding, constant folding, fusions -> *_optimized_float_model.onnx
``caldata``: read calibration samples the way the seeds describe
``pipeline``: the whole makertbin run, producing the five artifacts
"""

"""onnxruntime sessions for compiled pieces, configured for bit-exactness.

Every piece of a `.bin` and every whole-model reference the host compares it
with (HB_ONNXRuntime, hb_verifier) must use these options: with QDQ fusion on,
onnxruntime's fusion choices depend on which tensors are graph inputs and
outputs, so a model and its pieces would round differently (DESIGN.md,
"Numerical contract"). Spinning is off so that pieces run back to back do not
fight over cores.

A piece is data: ``session_from_bytes`` refuses one that would read a file of
the board (bpuemu.board.runtime.piece_guard) and opens the bytes as ONNX only.
"""
import onnxruntime as ort

from bpuemu.board.runtime.piece_guard import check_piece

#: Session config entries shared by the runtime and every host-side reference.
SESSION_CONFIG = {
    "session.disable_quant_qdq": "1",
    "session.intra_op.allow_spinning": "0",
    "session.inter_op.allow_spinning": "0",
}


def session_options(intra_op_threads: int = 1) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    for key, value in SESSION_CONFIG.items():
        opts.add_session_config_entry(key, value)
    return opts


def session_from_bytes(model: bytes, intra_op_threads: int = 1, piece: str = "ONNX piece") -> ort.InferenceSession:
    """A session of the ONNX model ``model`` (``piece``: how a refusal names it); InvalidModelFile when it holds
    external data."""
    check_piece(model, piece)
    opts = session_options(intra_op_threads)
    opts.add_session_config_entry("session.load_model_format", "ONNX")  # never an ORT-format model
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])

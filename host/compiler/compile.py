"""The compile stage of makertbin: quantized ONNX -> `.bin` model entry and blobs.

Around the partitioner (bpuemu.host.compiler.partition) this adds what the
yaml asks of the compiled model:

* ``input_batch``: the `.bin` takes N frames at once; the ONNX artifacts keep
  batch 1 (ptq_guide: "it does not affect the number of input batches input to
  the onnx model"). The quantized model is re-batched and re-checked; a model
  that cannot run with batch N gets the seed's advice.
* ``layer_out_dump``: every Conv's quantized output is also a model output,
  dequantized (a ``_HzDequantize`` step each), so a board run can dump them.
  The J6's ``debug_mode: dump_all_layers_output`` does the same for every Conv
  and MatMul (ptq_faq_j6, "How to dump model middle tier output?").
* The O3 compile cache: with optimize_level O3 the compiled result is kept in
  ``<working_dir>/.hb_mapper_cache/``, keyed by the SHA-256 of everything that
  goes into the compile, so an unchanged re-run reuses it.
"""
import hashlib
import logging
import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper

from bpuemu.common.container import decode_bin, encode_bin
from bpuemu.common.errors import InvalidInput, InvalidModelFile
from bpuemu.common.proto import model_pb2
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex, graph_inputs, open_session, with_outputs

log = logging.getLogger("bpuemu.host.makertbin")

CACHE_DIR = ".hb_mapper_cache"


def rebatch(quantized: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """The quantized model with every input's first dimension set to ``batch``."""
    m = onnx.ModelProto.FromString(quantized.SerializeToString())
    for vi in graph_inputs(m) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and (dims[0].dim_value in (0, 1)):
            dims[0].ClearField("dim_param")
            dims[0].dim_value = batch
    del m.graph.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        sess = open_session(m)  # as the board will run it
        feed = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else batch for d in i.shape]
            dtype = np.int8 if i.type == "tensor(int8)" else np.float32
            feed[i.name] = np.zeros(shape, dtype)
        sess.run(None, feed)
    except Exception as exc:  # shape inference and onnxruntime raise many types
        raise InvalidInput(
            f"the model does not support configuring input_batch {batch}: {str(exc).splitlines()[0][:200]}",
            hint="export a multi-batch onnx model, give its shape in input_shape, and size the calibration data to match",
        ) from None
    return m


def with_layer_outputs(quantized: onnx.ModelProto, op_types: Sequence[str] = ("Conv",),
                       through_activation: bool = False) -> onnx.ModelProto:
    """Add a DequantizeLinear of every ``op_types`` node's quantized output as a model output
    (layer_out_dump: Conv; dump_all_layers_output: Conv and MatMul, a Conv fused with the Relu/Clip
    after it (``through_activation``) dumped at the activation's output)."""
    m = onnx.ModelProto.FromString(quantized.SerializeToString())
    idx = GraphIndex(m)
    added = []
    for n in idx.nodes:
        if n.op_type not in op_types:
            continue
        out = n.output[0]
        if through_activation:  # a Conv fused with its Relu/Clip: the pair's output is what the BPU has
            act = idx.readers(out)
            if len(act) == 1 and act[0].op_type in ("Relu", "Clip"):
                out = act[0].output[0]
        q = next((c for c in idx.readers(out) if c.op_type == Q), None)
        if q is None or out in idx.outputs or n.output[0] in idx.outputs:
            continue
        name = f"{n.name}_layer_out"
        dq = helper.make_node(DQ, [q.output[0]] + list(q.input[1:]), [name], name=f"{n.name}_layer_out_dump")
        for a in q.attribute:
            if a.name == "axis":
                dq.attribute.append(a)
        m.graph.node.append(dq)
        added.append(name)
    m = with_outputs(m, added)
    del m.graph.value_info[:]
    log.info("%s: %d %s output(s) added as model outputs", "layer_out_dump" if tuple(op_types) == ("Conv",)
             else "dump_all_layers_output", len(added), "/".join(op_types))
    return onnx.shape_inference.infer_shapes(m)


def cache_key(quantized: onnx.ModelProto, parts: Sequence[bytes]) -> str:
    h = hashlib.sha256(quantized.SerializeToString(deterministic=True))
    for p in parts:
        h.update(b"\0")
        h.update(p)
    return h.hexdigest()


def cached_compile(working_dir: str, key: str) -> Optional[Tuple[model_pb2.Model, Dict[str, bytes]]]:
    path = os.path.join(working_dir, CACHE_DIR, f"{key}.bin")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            binfile = decode_bin(f.read(), source=path)
    except (InvalidModelFile, OSError):
        return None  # a damaged cache entry is a miss, never an error
    return binfile.model(), binfile.blobs


def store_compile(working_dir: str, key: str, model: model_pb2.Model, blobs: Dict[str, bytes]) -> None:
    from bpuemu.common.atomic import write_file_atomic

    d = os.path.join(working_dir, CACHE_DIR)
    os.makedirs(d, exist_ok=True)
    write_file_atomic(os.path.join(d, f"{key}.bin"), encode_bin([model], blobs))


def compile_for_board(quantized: onnx.ModelProto, name: str, specs, *, working_dir: str, force_cpu=(), force_bpu=(),
                      build_info=None, march: str = "bayes-e", input_batch: int = 1, layer_out_dump: bool = False,
                      optimize_level: str = "O3", input_sources: Optional[Dict[str, str]] = None,
                      dump_all_layers_output: bool = False, high_precision=(),
                      ) -> Tuple[model_pb2.Model, Dict[str, bytes], bool]:
    """(model entry, blobs, cache hit) for the `.bin`."""
    from bpuemu.host.compiler.partition import compile_model

    board_model = quantized
    copies = []
    for s in specs:  # never change the caller's specs
        c = model_pb2.InputSpec()
        c.CopyFrom(s)
        copies.append(c)
    specs = copies
    if input_batch > 1:
        board_model = rebatch(board_model, input_batch)
        for s in specs:
            if len(s.model_shape):
                s.model_shape[0] = input_batch
    if layer_out_dump or dump_all_layers_output:
        board_model = (with_layer_outputs(board_model, ("Conv", "MatMul"), through_activation=True)
                       if dump_all_layers_output else with_layer_outputs(board_model))
    parts = [name.encode(), march.encode(), repr(sorted(force_cpu)).encode(), repr(sorted(force_bpu)).encode(),
             b"".join(s.SerializeToString(deterministic=True) for s in specs),
             repr(sorted((input_sources or {}).items())).encode()]
    if high_precision:
        parts.append(repr(sorted(high_precision)).encode())
    key = cache_key(board_model, parts)
    use_cache = optimize_level == "O3"
    if use_cache:
        hit = cached_compile(working_dir, key)
        if hit is not None:
            model, blobs = hit
            if build_info is not None:
                model.build_info.CopyFrom(build_info)
            log.info("compile cache hit (%s): reusing the compiled model", os.path.join(working_dir, CACHE_DIR))
            return model, blobs, True
    compiled = compile_model(board_model, name, specs, force_cpu=sorted(force_cpu), force_bpu=sorted(force_bpu),
                             build_info=build_info, march=march, input_sources=input_sources,
                             high_precision=sorted(high_precision))
    if use_cache:
        store_compile(working_dir, key, compiled.model, compiled.blobs)
    return compiled.model, compiled.blobs, False

"""The numerical core in common/: dequantize agrees bit for bit with onnxruntime's DequantizeLinear."""
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.container import select_model
from bpuemu.common.errors import NotFound
from bpuemu.common.input_types import random_rt_inputs
from bpuemu.common.numerics import Dequantizer, dequantize
from bpuemu.common.proto import model_pb2


def _ort_dequantize(q, scale, zp, axis):
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)
    q_type = helper.np_dtype_to_tensor_dtype(q.dtype)
    g = helper.make_graph([node], "dq", [helper.make_tensor_value_info("q", q_type, list(q.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13 if q.dtype.itemsize == 1 else 21)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"q": q})[0]


@pytest.mark.parametrize("axis, channels", [(1, 1), (1, 16), (0, 2), (3, 5), (-1, 5)])
def test_dequantize_is_bit_exact_with_onnxruntime(axis, channels):
    rng = np.random.default_rng(1)
    shape = [2, 16, 3, 5]
    q = rng.integers(-128, 128, shape, dtype=np.int8)
    scale = (rng.random(channels) * 0.1 + 1e-3).astype(np.float32)
    zp = rng.integers(-10, 10, channels, dtype=np.int8)
    want = _ort_dequantize(q, scale if channels > 1 else scale.reshape(()), zp if channels > 1 else zp.reshape(()), axis)
    got = dequantize(q, scale, zp, axis)
    assert got.dtype == np.float32 and got.shape == q.shape
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("channels", [1, 7])
def test_dequantize_of_8_and_16_bit_tensors_is_bit_exact_over_their_whole_range(dtype, channels):
    """The runtime's _HzDequantize subtracts and scales in float32 for these types (exact there): every value of the
    type, the zero point anywhere in it, large and small scales."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(2)
    q = np.concatenate([np.array([info.min, info.max, 0], dtype),
                        rng.integers(info.min, info.max, 7 * 64 - 3, dtype=dtype, endpoint=True)]).reshape(1, 7, 8, 8)
    scale = (10.0 ** rng.uniform(-6, 2, channels)).astype(np.float32)
    zp = rng.integers(info.min, info.max, channels, dtype=dtype, endpoint=True)
    want = _ort_dequantize(q, scale if channels > 1 else scale.reshape(()), zp if channels > 1 else zp.reshape(()), 1)
    got = dequantize(q, scale, zp, 1)
    assert got.dtype == np.float32 and got.shape == q.shape
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


def test_dequantizer_reuses_parameters_across_ranks():
    d = Dequantizer([0.5, 2.0], None, axis=1)
    assert np.array_equal(d(np.array([[2, 2]], np.int8)), [[1.0, 4.0]])
    assert np.array_equal(d(np.ones((1, 2, 1, 1), np.int8)).reshape(-1), [0.5, 2.0])
    assert sorted(d._by_rank) == [2, 4]


def test_random_inputs_are_seeded_and_typed():
    img = model_pb2.InputSpec(name="img", input_type_rt="rgb", input_layout_rt="NHWC",
                                model_layout="NCHW", model_shape=[1, 3, 4, 4])
    fm = model_pb2.InputSpec(name="fm", input_type_rt="featuremap", model_shape=[1, 2], model_dtype="float32")
    a, b = random_rt_inputs([img, fm]), random_rt_inputs([img, fm])
    assert a[0].dtype == np.uint8 and a[1].dtype == np.float32 and a[1].shape == (1, 2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(random_rt_inputs([img], seed=1)[0], a[0])


def test_select_model_one_error_class_naming_no_flag():
    models = {"alpha": 1, "beta": 2}
    assert select_model(models, "beta", "m.bin") == 2
    assert select_model({"only": 3}, None, "m.bin") == 3
    for name, text in ((None, "2 models in m.bin (alpha, beta); choose one"), ("nope", "'nope' is not in m.bin")):
        with pytest.raises(NotFound, match=re.escape(text)) as info:
            select_model(models, name, "m.bin")
        assert "--" not in str(info.value)


def test_exec_json_reader_refuses_what_it_cannot_read():
    from bpuemu.common import exec_json
    from bpuemu.common.errors import IncompatibleVersion
    from bpuemu.common.version import EXEC_JSON_VERSION

    doc = exec_json.document("infer", "aarch64", "1.22.0", 3.0, model="m", latency_ms=[1.0], outputs=[], intermediates=[])
    assert exec_json.read_document(doc, "infer")["board"]["arch"] == "aarch64"
    newer = doc.replace(f'"version":{EXEC_JSON_VERSION}', f'"version":{EXEC_JSON_VERSION + 1}')
    for text, words in ((newer, "writes --json version"), ("Load model on local runtime", "did not answer with a --json"),
                        ('{"format": "other"}', "not bpuemu.hrt_model_exec"), (doc, "answered 'infer' to 'perf'")):
        with pytest.raises(IncompatibleVersion, match=re.escape(words)):
            exec_json.read_document(text, "perf" if text is doc else "infer")

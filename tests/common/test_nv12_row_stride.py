"""nv12 inputs whose rows are padded to a J6 march's stride (InputSpec.row_stride): sizes, padding, refusal."""
import numpy as np
import pytest

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import image_to_rt, nv12_rows_at_stride, rt_byte_size, to_model_input
from bpuemu.common.proto import model_pb2


def _spec(row_stride=0):
    return model_pb2.InputSpec(name="data", input_type_rt="nv12", model_layout="NHWC", model_dtype="int8",
                               model_shape=[1, 4, 6, 3], plan_tensor="data", row_stride=row_stride)


def test_an_image_becomes_a_padded_frame_that_converts_as_the_dense_one_does():
    rgb = np.random.default_rng(0).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    dense, padded = image_to_rt(rgb, _spec()), image_to_rt(rgb, _spec(32))
    assert dense.size == rt_byte_size(_spec()) == 36 and padded.size == rt_byte_size(_spec(32)) == 4 * 32 * 3 // 2
    assert np.array_equal(padded, nv12_rows_at_stride(dense, 4, 6, 32))
    assert np.array_equal(to_model_input(padded, _spec(32)), to_model_input(dense, _spec()))


def test_a_frame_at_another_row_stride_is_refused_naming_both():
    dense = np.zeros(36, np.uint8)
    with pytest.raises(InvalidInput, match="rows 6 bytes apart; the model's nv12 row stride is 32 bytes"):
        to_model_input(dense, _spec(32))
    with pytest.raises(InvalidInput, match="rows 64 bytes apart"):
        to_model_input(nv12_rows_at_stride(dense, 4, 6, 64), _spec(32))
    with pytest.raises(InvalidInput, match="needs 192 bytes"):   # not a whole frame at any stride: the size line
        to_model_input(np.zeros(37, np.uint8), _spec(32))

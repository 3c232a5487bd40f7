"""The march descriptions hold what the J6 FAQ and the X5 guide say differs, and nothing else."""
import pytest

from bpuemu.common.march import ASSUMED, DOCUMENTED, J6_MARCHES, MARCHES, UnknownMarch, march


def test_the_six_marches_of_the_two_generations():
    assert set(MARCHES) == {"bayes-e", "nash-e", "nash-m", "nash-b", "nash-h", "nash-p"}
    assert march().name == "bayes-e" and march("").name == "bayes-e"
    assert J6_MARCHES == ("nash-e", "nash-m", "nash-b", "nash-h", "nash-p")


@pytest.mark.parametrize("name,tail,align", [("bayes-e", "int32", 1), ("nash-e", "int32", 32), ("nash-m", "int32", 32),
                                             ("nash-b", "float32", 32), ("nash-h", "float32", 64),
                                             ("nash-p", "float32", 64)])
def test_tail_output_type_and_nv12_stride_alignment_as_the_faq_gives_them(name, tail, align):
    m = march(name)
    assert m.tail_output_dtype == tail
    assert m.nv12_stride_align == align
    if m.is_j6:
        assert m.nv12_align_source == DOCUMENTED
        assert m.aligned_stride(100) % align == 0 and m.aligned_stride(100) - 100 < align
        assert m.aligned_stride(align * 3) == align * 3


def test_j6_flow_differs_from_x5_where_the_documents_say():
    x5, j6 = march("bayes-e"), march("nash-p")
    assert (x5.flow.convert_command, x5.flow.model_suffix) == ("hb_mapper makertbin", ".bin")
    assert (j6.flow.convert_command, j6.flow.model_suffix, j6.flow.log_file) == ("hb_compile", ".hbm", "hb_compile.log")
    assert j6.flow.quantized_artifact == "_quantized_model.bc" and j6.flow.ptq_artifact == "_ptq_model.onnx"
    assert x5.optimize_levels[-1] == "O3" and j6.optimize_levels == ("O0", "O1", "O2")
    assert j6.opset_range == (10, 19) and j6.max_ir_version == 9
    assert x5.converts_input_layout and not j6.converts_input_layout


def test_j6_timing_says_it_is_not_measured():
    for name in J6_MARCHES:
        t = march(name).timing
        assert t.method_source == ASSUMED
        assert "no board measurements" in t.label and "assumed" in t.label
    assert "fitted" in march("bayes-e").timing.label


def test_unknown_march_is_one_clear_error():
    with pytest.raises(UnknownMarch) as e:
        march("nash-x")
    assert "nash-x" in str(e.value) and "nash-e" in str(e.value)

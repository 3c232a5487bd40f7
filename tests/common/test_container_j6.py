"""The J6 flow's `.hbm` and `.bc` containers: round trip, the kind each file is, and refusal of damage."""
import hashlib
import struct

import pytest

from bpuemu.common.container import (
    BC_FORMAT,
    BC_MAGIC,
    HBM_MAGIC,
    HEADER_SIZE,
    decode_bc,
    decode_bin,
    encode_bc,
    encode_bin,
    read_bc,
    read_bin,
    write_bc,
    write_hbm,
)
from bpuemu.common.errors import IncompatibleVersion, InvalidModelFile
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import FORMAT_MAJOR

Kind = model_pb2.PlanStep
ONNX = b"\x08\x07fake onnx bytes" * 9


def _model(march="nash-e") -> model_pb2.Model:
    m = model_pb2.Model(name="m", march=march, output_tensors=["out"])
    m.plan.add(kind=Kind.BPU_SUBGRAPH, name="BPU_m_subgraph_0", blob="000_sub", inputs=["data"], outputs=["out"])
    return m


def _bc() -> model_pb2.FixedPointModel:
    fp = model_pb2.FixedPointModel(name="m", march="nash-p", input_names=["b", "a"], output_names=["out"])
    fp.nodes.add(name="conv", op_type="Conv", on="BPU", subgraph=0, type="HzSQuantizedConv", output_dtype="float32")
    return fp


def test_hbm_round_trips_and_loads_like_a_bin(tmp_path):
    path = tmp_path / "m.hbm"
    sha = write_hbm(path, [_model()], {"000_sub": b"blob"})
    data = path.read_bytes()
    assert data[:8] == HBM_MAGIC and hashlib.sha256(data).hexdigest() == sha
    f = read_bin(path)
    assert (f.kind, f.model().march, f.blobs) == ("hbm", "nash-e", {"000_sub": b"blob"})
    plain = encode_bin([_model()], {"000_sub": b"blob"})
    assert decode_bin(plain).kind == "bin" and plain[8:] == data[8:]   # the same manifest and blobs


def test_bc_round_trips(tmp_path):
    path = tmp_path / "m_quantized_model.bc"
    write_bc(path, _bc(), ONNX)
    data = path.read_bytes()
    assert data[:8] == BC_MAGIC and struct.unpack_from("<HH", data, 8) == BC_FORMAT
    f = read_bc(path)
    assert f.onnx_bytes == ONNX
    assert (f.manifest.march, list(f.manifest.input_names)) == ("nash-p", ["b", "a"])
    assert f.manifest.nodes[0].output_dtype == "float32" and f.manifest.producer.startswith("bpuemu ")


def _manifest_len(d: bytes) -> int:
    return struct.unpack_from("<Q", d, 16)[0]


def _flip(d: bytes, at: int) -> bytes:
    b = bytearray(d)
    b[at] ^= 0xFF
    return bytes(b)


BC_DAMAGE = {
    "empty": (lambda d: b"", "not a bpuemu .bc fixed-point model (the file is empty)"),
    "wrong_magic": (lambda d: b"NOTABC!!" + d[8:], "not a bpuemu .bc fixed-point model (magic"),
    "truncated_header": (lambda d: d[:20], "truncated: 20 bytes, shorter than the 56-byte header"),
    "truncated_manifest": (lambda d: d[: HEADER_SIZE + _manifest_len(d) // 2], "truncated: manifest needs"),
    "truncated_blob": (lambda d: d[:-3], "truncated: blob 'quantized_model.onnx'"),
    "corrupt_manifest": (lambda d: _flip(d, HEADER_SIZE + 3), "corrupt: manifest checksum mismatch"),
    "corrupt_blob": (lambda d: _flip(d, len(d) - 5), "corrupt: blob 'quantized_model.onnx' checksum mismatch"),
    "trailing": (lambda d: d + b"zz", "2 unexpected trailing bytes"),
    "an_hbm": (lambda d: encode_bin([_model()], {"000_sub": b"x"}, kind="hbm"), "is a bpuemu .hbm model, not a .bc"),
}


@pytest.mark.parametrize("damage", list(BC_DAMAGE))
def test_damaged_bc_is_refused_with_one_line(tmp_path, damage):
    fn, expected = BC_DAMAGE[damage]
    path = tmp_path / "bad.bc"
    path.write_bytes(fn(encode_bc(_bc(), ONNX)))
    with pytest.raises(InvalidModelFile) as exc:
        read_bc(path)
    assert expected in exc.value.message and "\n" not in exc.value.message
    assert exc.value.message.startswith(f"{path}: ") and "hb_compile" in exc.value.hint


def test_newer_bc_and_hbm_are_refused():
    bc = bytearray(encode_bc(_bc(), ONNX))
    struct.pack_into("<H", bc, 8, BC_FORMAT[0] + 1)
    with pytest.raises(IncompatibleVersion, match=r"\.bc fixed-point model format 2\.0 is newer"):
        decode_bc(bytes(bc))
    hbm = bytearray(encode_bin([_model()], {"000_sub": b"x"}, kind="hbm"))
    struct.pack_into("<H", hbm, 8, FORMAT_MAJOR + 1)
    with pytest.raises(IncompatibleVersion, match=r"\.hbm model format .* is newer"):
        decode_bin(bytes(hbm))


def test_a_bc_is_not_loaded_as_a_deployable_model():
    with pytest.raises(InvalidModelFile, match=r"is a bpuemu \.bc fixed-point model, not a \.bin model"):
        decode_bin(encode_bc(_bc(), ONNX))


def test_damaged_hbm_names_hb_compile():
    data = encode_bin([_model()], {"000_sub": b"blob"}, kind="hbm")
    with pytest.raises(InvalidModelFile) as exc:
        decode_bin(data[:-1])
    assert "truncated: blob '000_sub'" in exc.value.message and "hb_compile" in exc.value.hint

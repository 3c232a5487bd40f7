"""The `.bin` container: round trip, several models, and refusal of every kind of damage."""
import hashlib
import os
import struct

import pytest

from bpuemu.common import container
from bpuemu.common.container import (
    HEADER_SIZE,
    MAGIC,
    BinFile,
    decode_bin,
    encode_bin,
    file_sha256,
    read_bin,
    sha256_hex,
    write_bin,
)
from bpuemu.common.errors import IncompatibleVersion, InvalidModelFile, NotFound
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import FORMAT_MAJOR, FORMAT_MINOR

Kind = model_pb2.PlanStep


def _model(name: str, blobs) -> model_pb2.Model:
    m = model_pb2.Model(name=name, march="bayes-e", output_tensors=["out"])
    m.input_specs.add(name="data", input_type_rt="rgb", input_layout_rt="NHWC", model_layout="NCHW",
                      model_dtype="int8", model_shape=[1, 3, 4, 4], plan_tensor="data")
    m.inputs.add(name="data", valid_shape=[1, 4, 4, 3], tensor_type=model_pb2.HB_DNN_IMG_TYPE_RGB)
    m.outputs.add(name="out", valid_shape=[1, 2], tensor_type=model_pb2.HB_DNN_TENSOR_TYPE_F32)
    m.plan.add(kind=Kind.PREPROCESS, name="Preprocess", inputs=["rt:data"], outputs=["data"])
    for i, blob in enumerate(blobs):
        m.plan.add(kind=Kind.BPU_SUBGRAPH, name=f"BPU_{name}_subgraph_{i}", blob=blob, inputs=["data"], outputs=["out"])
    m.plan.add(kind=Kind.DEQUANTIZE, name="out_HzDequantize", inputs=["out"], outputs=["out"], scale=[0.5], zero_point=[3])
    m.build_info.deps.add(key="hb_mapper version", value="test")
    return m


BLOBS = {
    "000_first": b"\x00first blob" * 7,
    "001_second": bytes(range(256)) * 3,
    "002_empty": b"",
    "003_last": b"the last blob in the area",
}


@pytest.fixture
def two_models():
    return [_model("alpha", ["000_first", "002_empty"]), _model("beta", ["001_second", "003_last"])]


@pytest.fixture
def good(two_models) -> bytes:
    return encode_bin(two_models, BLOBS)


def _blob_position(data: bytes, name: str):
    """(absolute offset, size) of a blob in encoded bytes."""
    _, _, _, _, mlen, _ = struct.unpack_from("<8sHHIQ32s", data)
    manifest = model_pb2.BinManifest.FromString(data[HEADER_SIZE:HEADER_SIZE + mlen])
    ref = next(r for r in manifest.blobs if r.name == name)
    return HEADER_SIZE + mlen + ref.offset, ref.size


def _manifest_len(data: bytes) -> int:
    return struct.unpack_from("<Q", data, 16)[0]


# --- round trip ----------------------------------------------------------------

def test_round_trip_keeps_manifest_and_blobs(two_models, good):
    b = decode_bin(good, source="mem.bin")
    assert isinstance(b, BinFile)
    assert list(b.manifest.models) == two_models
    assert b.blobs == BLOBS
    assert b.model_names == ["alpha", "beta"]
    assert b.format_version == (FORMAT_MAJOR, FORMAT_MINOR)
    assert b.sha256 == sha256_hex(good)
    assert b.source == "mem.bin"
    assert b.manifest.producer.startswith("bpuemu ")
    assert not b.manifest.packed


def test_encode_is_deterministic_and_header_is_as_documented(two_models, good):
    assert encode_bin(two_models, BLOBS) == good
    magic, major, minor, flags, mlen, _ = struct.unpack_from("<8sHHIQ32s", good)
    assert (magic, major, minor, flags) == (MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0)
    assert HEADER_SIZE == 56
    assert len(good) == HEADER_SIZE + mlen + sum(len(v) for v in BLOBS.values())


def test_write_read_round_trip(tmp_path, two_models):
    path = tmp_path / "model.bin"
    sha = write_bin(path, two_models, BLOBS, packed=True)
    assert sha == file_sha256(path)
    b = read_bin(path)
    assert b.sha256 == sha
    assert b.source == str(path)
    assert list(b.manifest.models) == two_models
    assert b.blobs == BLOBS
    assert b.manifest.packed


def test_model_by_name_and_unknown_name(good):
    b = decode_bin(good, source="two.bin")
    assert b.model("beta").name == "beta"
    assert b.model("alpha").plan[1].blob == "000_first"
    with pytest.raises(NotFound) as exc:
        b.model("gamma")
    assert "gamma" in exc.value.message and "alpha" in exc.value.message and "beta" in exc.value.message


def test_default_model_needs_exactly_one(good):
    with pytest.raises(NotFound) as exc:
        decode_bin(good, source="two.bin").model()
    assert "2 models" in exc.value.message and "two.bin" in exc.value.message
    single = decode_bin(encode_bin([_model("solo", ["000_first"])], {"000_first": BLOBS["000_first"]}))
    assert single.model().name == "solo"
    assert single.model(None) is single.model("solo")


# --- corruption ----------------------------------------------------------------

def _flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0xFF
    return bytes(b)


CORRUPTIONS = {
    "wrong_magic": (lambda d: b"NOTABIN!" + d[8:], "not a bpuemu .bin model"),
    "empty_file": (lambda d: b"", "not a bpuemu .bin model"),
    "not_a_bin_short": (lambda d: b"hello", "not a bpuemu .bin model"),
    "truncated_header": (lambda d: d[:30], "truncated: 30 bytes, shorter than the 56-byte header"),
    "truncated_manifest": (lambda d: d[: HEADER_SIZE + _manifest_len(d) // 2], "truncated: manifest needs"),
    "truncated_blob": (lambda d: d[:-1], "truncated: blob '003_last'"),
    "manifest_flipped_byte": (lambda d: _flip(d, HEADER_SIZE + 10), "corrupt: manifest checksum mismatch"),
    "manifest_checksum_flipped": (lambda d: _flip(d, 30), "corrupt: manifest checksum mismatch"),
    "blob_flipped_byte": (lambda d: _flip(d, _blob_position(d, "001_second")[0] + 100), "corrupt: blob '001_second' checksum mismatch"),
    "trailing_garbage": (lambda d: d + b"xyz", "3 unexpected trailing bytes"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_file_is_refused_with_one_clear_line(tmp_path, good, kind):
    damage, expected = CORRUPTIONS[kind]
    path = tmp_path / "bad.bin"
    path.write_bytes(damage(good))
    with pytest.raises(InvalidModelFile) as exc:
        read_bin(path)
    msg = exc.value.message
    assert expected in msg
    assert msg.startswith(f"{path}: ")
    assert "\n" not in msg
    # The hint (second line of str()) tells the user what to do.
    assert exc.value.hint and "Hint:" in str(exc.value)


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_bytes_are_refused(good, kind):
    damage, expected = CORRUPTIONS[kind]
    with pytest.raises(InvalidModelFile, match="^<bytes>: "):
        decode_bin(damage(good))


def test_manifest_that_does_not_parse_is_refused(good):
    # A manifest whose checksum matches but whose bytes are not a BinManifest.
    junk = b"\xff\xff\xff\xff\xff"
    header = struct.pack("<8sHHIQ32s", MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(junk), hashlib.sha256(junk).digest())
    with pytest.raises(InvalidModelFile, match="manifest does not parse"):
        decode_bin(header + junk)


def test_newer_major_version_is_incompatible(tmp_path, good):
    data = bytearray(good)
    struct.pack_into("<H", data, 8, FORMAT_MAJOR + 1)
    path = tmp_path / "future.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(IncompatibleVersion) as exc:
        read_bin(path)
    assert not isinstance(exc.value, InvalidModelFile)
    assert f"{FORMAT_MAJOR + 1}.{FORMAT_MINOR}" in exc.value.message
    assert str(path) in exc.value.message
    assert "\n" not in exc.value.message


def test_newer_minor_version_is_still_read(good, two_models):
    data = bytearray(good)
    struct.pack_into("<H", data, 10, FORMAT_MINOR + 1)
    b = decode_bin(bytes(data))
    assert b.format_version == (FORMAT_MAJOR, FORMAT_MINOR + 1)
    assert list(b.manifest.models) == two_models


def test_read_missing_file_and_directory(tmp_path):
    with pytest.raises(NotFound, match="not found"):
        read_bin(tmp_path / "nope.bin")
    with pytest.raises(InvalidModelFile, match="is a directory"):
        read_bin(tmp_path)


# --- writer refusals -------------------------------------------------------------

def test_encode_refuses_plan_step_naming_a_missing_blob():
    with pytest.raises(InvalidModelFile) as exc:
        encode_bin([_model("alpha", ["000_first", "999_ghost"])], {"000_first": b"x"})
    assert "999_ghost" in exc.value.message


def test_encode_refuses_unreferenced_blob():
    with pytest.raises(InvalidModelFile) as exc:
        encode_bin([_model("alpha", ["000_first"])], {"000_first": b"x", "dead_weight": b"y"})
    assert "dead_weight" in exc.value.message


def test_encode_refuses_duplicate_model_names():
    with pytest.raises(InvalidModelFile, match="duplicate"):
        encode_bin([_model("alpha", ["a"]), _model("alpha", ["b"])], {"a": b"1", "b": b"2"})


def test_decode_refuses_step_naming_blob_absent_from_the_manifest():
    # Hand-made manifest (encode_bin would refuse it): the plan names a blob the file lacks.
    manifest = model_pb2.BinManifest()
    manifest.models.append(_model("alpha", ["missing_blob"]))
    mbytes = manifest.SerializeToString()
    header = struct.pack("<8sHHIQ32s", MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(mbytes), hashlib.sha256(mbytes).digest())
    with pytest.raises(InvalidModelFile, match="missing blob 'missing_blob'"):
        decode_bin(header + mbytes)


# --- atomic writes -----------------------------------------------------------------

def test_write_bin_leaves_only_the_target(tmp_path, two_models):
    write_bin(tmp_path / "a.bin", two_models, BLOBS)
    write_bin(tmp_path / "a.bin", two_models[:1], {k: BLOBS[k] for k in ("000_first", "002_empty")})
    assert os.listdir(tmp_path) == ["a.bin"]
    assert read_bin(tmp_path / "a.bin").model_names == ["alpha"]


def test_write_bin_refused_input_writes_nothing(tmp_path):
    with pytest.raises(InvalidModelFile):
        write_bin(tmp_path / "a.bin", [_model("alpha", ["ghost"])], {})
    assert os.listdir(tmp_path) == []


def test_write_bin_failure_keeps_old_file_and_no_temp(tmp_path, two_models, monkeypatch):
    target = tmp_path / "a.bin"
    write_bin(target, two_models, BLOBS)
    before = target.read_bytes()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(container.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_bin(target, two_models[:1], {k: BLOBS[k] for k in ("000_first", "002_empty")})
    assert os.listdir(tmp_path) == ["a.bin"]
    assert target.read_bytes() == before

"""The bugs the fuzz tests found, pinned as plain examples (each failed before its fix)."""
import hashlib

import numpy as np
import pytest

from bpuemu.common.container import HEADER_SIZE, MAGIC, _HEADER, decode_bin, read_bin
from bpuemu.common.errors import InvalidInput, InvalidModelFile
from bpuemu.common.proto import model_pb2


def _resealed(path, edit):
    binfile = read_bin(path)
    manifest = model_pb2.BinManifest()
    manifest.CopyFrom(binfile.manifest)
    edit(manifest)
    with open(path, "rb") as f:
        data = f.read()
    mlen = len(binfile.manifest.SerializeToString(deterministic=True))
    mbytes = manifest.SerializeToString()
    return _HEADER.pack(MAGIC, 1, 0, 0, len(mbytes), hashlib.sha256(mbytes).digest()) + mbytes + data[HEADER_SIZE + mlen:]


def test_a_manifest_with_no_model_is_refused(sample_bins):
    data = _resealed(sample_bins["rgb"], lambda m: m.ClearField("models"))
    with pytest.raises(InvalidModelFile, match="holds no model"):
        decode_bin(data, "x.bin")


@pytest.mark.parametrize("edit,words", [
    (lambda m: m.models[0].plan[1].inputs.__setitem__(0, "nowhere"), "no earlier step produces"),
    (lambda m: m.models[0].plan[1].outputs.__setitem__(0, ""), "does not produce"),
    (lambda m: m.models[0].input_specs[0].ClearField("model_shape"), "4-D model_shape"),
    (lambda m: m.models[0].input_specs[0].model_shape.__setitem__(2, 1 << 30), "model_shape"),
    (lambda m: m.models[0].plan[2].perm.extend([0, 0]), "not a permutation"),
    (lambda m: m.models[0].output_tensors.__setitem__(0, "gone"), "produced by no step"),
    # numpy reads these as record formats and raised ValueError (an internal error), not a damaged-file error
    (lambda m: setattr(m.models[0].input_specs[0], "model_dtype", "i4,i4,(-1)f"), "not a numeric type"),
    (lambda m: setattr(m.models[0].input_specs[0], "model_dtype", "i4,(99999999999)f8"), "not a numeric type"),
])
def test_an_inconsistent_plan_is_refused_at_load(sample_bins, edit, words):
    from bpuemu.board.runtime import Runtime

    binfile = decode_bin(_resealed(sample_bins["rgb"], edit), "x.bin")
    with pytest.raises(InvalidModelFile, match=words):
        Runtime().load(binfile)


@pytest.mark.parametrize("name,content,words", [
    ("x.npy", b"", "not a plain .npy"),
    ("x.npy", np.lib.format.magic(1, 0) + b"\x10\x00{'descr':", "not a plain .npy"),
    ("x.txt", b"1 2 three", "not a text file"),
    ("x.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 20, "cannot decode image"),
])
def test_unreadable_input_files_are_one_user_error(tmp_path, sample_bins, name, content, words):
    from bpuemu.board.runtime.inputs import read_input

    spec = read_bin(sample_bins["rgb"]).model().input_specs[0]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match=words):
        read_input(str(path), spec)


def test_a_featuremap_shape_error_names_the_layout_not_nv12(sample_bins):
    from bpuemu.board.runtime import Runtime

    rt = Runtime()
    rt.load(sample_bins["featuremap"])
    with pytest.raises(InvalidInput) as exc:
        rt.model().run([np.zeros((1, 16, 16, 3), np.float32)])
    assert "nv12" not in str(exc.value)


@pytest.mark.parametrize("dtype", ["01", "(2,)i4", "i4,i4", "O", "S3", "<U2", "V8", "complex64"])
def test_a_wire_tensor_of_a_strange_dtype_is_one_user_error(dtype):
    """numpy parsed "01" as a Python literal: SyntaxError, an INTERNAL status from the daemon."""
    from bpuemu.common.proto import board_pb2
    from bpuemu.common.tensor import from_wire

    with pytest.raises(InvalidInput, match="unknown dtype"):
        from_wire(board_pb2.Tensor(name="data", dtype=dtype, shape=[1], data=b"\0" * 8))


def test_a_text_input_with_a_non_ascii_character_is_one_user_error_not_a_crash(tmp_path, sample_bins):
    """numpy 2.4's loadtxt segfaulted on this with an integer dtype: the process died (SIGSEGV)."""
    import subprocess
    import sys

    path = tmp_path / "x.txt"
    path.write_bytes(b"1 \xf3\xbc\x89\x8d")
    code = ("import sys; from bpuemu.common.container import read_bin; from bpuemu.board.runtime.inputs import read_input\n"
            "from bpuemu.common.errors import InvalidInput\n"
            f"spec = read_bin({sample_bins['rgb']!r}).model().input_specs[0]\n"
            "try:\n    read_input(sys.argv[1], spec)\nexcept InvalidInput as e:\n    print('ERROR', e)\n")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "non-ASCII" in run.stdout

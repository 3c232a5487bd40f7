"""The `.bin` reader fuzzed: any bytes give a model or the one user error, never more memory than the file.

Properties (also run for longer by bench/fuzz.py):
- random bytes, and random bytes behind a valid header;
- a valid file truncated, bit-flipped, with its manifest length pointing past the end, with junk appended;
- a valid file whose manifest has absurd fields (blob offsets/sizes past the end, thousands of repeated
  entries, huge shapes, unknown enum values) re-sealed with a correct checksum, so it gets past the
  container checks into the runtime's load and hb_model_info.
"""
import hashlib
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, strategies as st

from bpuemu.common.container import HEADER_SIZE, MAGIC, _HEADER, decode_bin
from bpuemu.common.errors import BpuEmuError
from bpuemu.common.proto import model_pb2

from fuzzing import mutated

#: Python-side memory the reader may use beyond twice the file (the file itself plus its blobs).
SLACK = 1 << 20


def _decode_bounded(data: bytes):
    """decode_bin, asserting it allocated no more than the file's size allows."""
    tracemalloc.start()
    try:
        try:
            return decode_bin(data, "fuzz.bin")
        except BpuEmuError:
            return None
        finally:
            _, peak = tracemalloc.get_traced_memory()
            assert peak <= 2 * len(data) + SLACK, f"peak {peak} bytes reading a {len(data)}-byte file"
    finally:
        tracemalloc.stop()


def _check_decode(data: bytes) -> None:
    _decode_bounded(data)


def _header(manifest: bytes, major: int = 1, minor: int = 0, length: int = None) -> bytes:
    return _HEADER.pack(MAGIC, major, minor, 0, len(manifest) if length is None else length,
                        hashlib.sha256(manifest).digest())


def _sealed(manifest: model_pb2.BinManifest, blob_area: bytes) -> bytes:
    mbytes = manifest.SerializeToString()
    return _header(mbytes) + mbytes + blob_area


def _load_everywhere(data: bytes) -> None:
    """Whatever decodes must also load in the runtime and print in hb_model_info, or be one user error."""
    binfile = _decode_bounded(data)
    if binfile is None:
        return
    from bpuemu.board.runtime import Runtime
    from bpuemu.host.tools.model_info import model_info_text

    try:
        model_info_text(binfile)
    except BpuEmuError:
        pass
    try:
        rt = Runtime()
        rt.load(binfile)
    except BpuEmuError:
        return
    for name in rt.model_names:
        m = rt.model(name)
        try:
            m.run(_INPUTS[: len(m.input_names)] + _INPUTS[:1] * (len(m.input_names) - 1))
        except BpuEmuError:
            pass


#: One rgb 16x16 frame: what the sample model takes (a damaged model must still answer it sanely).
_INPUTS = [np.zeros((1, 16, 16, 3), np.uint8)]


def properties(sample_path: str):
    """name -> (strategy, check) of the reader's properties, for tests and bench/fuzz.py."""
    with open(sample_path, "rb") as f:
        valid = f.read()
    mlen = struct.unpack_from("<Q", valid, 16)[0]
    manifest = model_pb2.BinManifest.FromString(valid[HEADER_SIZE:HEADER_SIZE + mlen])
    blob_area = valid[HEADER_SIZE + mlen:]

    @st.composite
    def damaged(draw):
        data = bytearray(valid)
        how = draw(st.sampled_from(["truncate", "flip", "length", "append", "version"]))
        if how == "truncate":
            del data[draw(st.integers(0, len(data) - 1)):]
        elif how == "flip":
            for _ in range(draw(st.integers(1, 8))):
                i = draw(st.integers(0, len(data) - 1))
                data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "length":
            struct.pack_into("<Q", data, 16, draw(st.integers(0, 2**64 - 1)))
        elif how == "append":
            data += draw(st.binary(min_size=1, max_size=64))
        else:
            struct.pack_into("<HH", data, 8, draw(st.integers(0, 65535)), draw(st.integers(0, 65535)))
        return bytes(data)

    random_bytes = st.one_of(st.binary(max_size=512), st.binary(max_size=512).map(lambda b: _header(b, length=None) + b),
                             st.binary(max_size=512).map(lambda b: MAGIC + b))
    absurd = mutated(manifest, max_mutations=3).map(lambda m: _sealed(m, blob_area))
    return {
        "random_bytes": (random_bytes, _check_decode),
        "damaged_file": (damaged(), _check_decode),
        "absurd_manifest": (absurd, _load_everywhere),
    }


@pytest.mark.parametrize("name", ["random_bytes", "damaged_file", "absurd_manifest"])
def test_bin_reader(sample_bins, name):
    strategy, check = properties(sample_bins["rgb"])[name]
    given(strategy)(check)()


def test_the_properties_see_a_valid_file_as_valid(sample_bins):
    """The checks are not vacuous: the untouched file decodes and loads."""
    with open(sample_bins["rgb"], "rb") as f:
        data = f.read()
    assert _decode_bounded(data) is not None
    _load_everywhere(data)

"""Reader and writer of the `.bin` hybrid heterogeneous model container, and of the J6 flow's `.hbm`
and `.bc`, which share its layout.

Layout (the proto/bpuemu/board/v1/model.proto header has the same table):

    offset  size  field
    0       8     magic: b"BPUEMUBN" (.bin), b"BPUEMUHM" (.hbm), b"BPUEMUBC" (.bc)
    8       2     format major (uint16 LE); a newer major is refused
    10      2     format minor (uint16 LE)
    12      4     flags (reserved, 0)
    16      8     manifest length N (uint64 LE)
    24      32    SHA-256 of the manifest bytes
    56      N     manifest (serialized BinManifest)
    56+N    ...   blob area; each BlobRef gives offset (from the blob area),
                  size and SHA-256

``write_bin`` is the API the compile step of ``hb_mapper makertbin`` and
``hb_pack`` call; ``read_bin`` is what the runtime, the daemon and the model
tools call. Every failure is an ``InvalidModelFile`` (or
``IncompatibleVersion`` for a newer major) whose message names the file and
what is wrong with it.

The three kinds (bpuemu's own formats; the real `.hbm` and `.bc` are proprietary):

* ``.bin`` -- the X5's deployable model (``hb_mapper makertbin``): a BinManifest.
* ``.hbm`` -- the J6's deployable model (``hb_compile``): the same BinManifest
  and blobs as a `.bin` (each Model names its march), under its own magic, so
  the runtime and the tools load it as they load a `.bin`
  (``write_hbm``; ``read_bin`` reads both; ``BinFile.kind`` says which).
* ``.bc`` -- the J6's fixed-point model (``*_quantized_model.bc``): a
  FixedPointModel manifest (march, input/output order, per-node placement and
  output data type, removed nodes, build info) and one blob, the quantized ONNX
  model in the integer domain before partition and compile (``write_bc`` /
  ``read_bc``). Its format version is ``BC_FORMAT``, apart from the `.bin`'s.
"""
import hashlib
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, TypeVar, Union

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.errors import IncompatibleVersion, InvalidModelFile, NotFound
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import FORMAT_MAJOR, FORMAT_MINOR, __version__

MAGIC = b"BPUEMUBN"
HBM_MAGIC = b"BPUEMUHM"
BC_MAGIC = b"BPUEMUBC"
#: The `.bc` format version (major, minor); a newer major is refused.
BC_FORMAT = (1, 0)
_HEADER = struct.Struct("<8sHHIQ32s")
HEADER_SIZE = _HEADER.size  # 56

#: kind -> (magic, what it is called in messages, the tool that makes it)
KINDS = {
    "bin": (MAGIC, ".bin model", "hb_mapper makertbin"),
    "hbm": (HBM_MAGIC, ".hbm model", "hb_compile"),
    "bc": (BC_MAGIC, ".bc fixed-point model", "hb_compile"),
}
_KIND_OF_MAGIC = {magic: kind for kind, (magic, _, _) in KINDS.items()}


@dataclass
class BinFile:
    """A parsed `.bin`: its manifest and its verified blobs."""

    manifest: model_pb2.BinManifest
    blobs: Dict[str, bytes]
    sha256: str
    source: str = "<bytes>"
    format_version: tuple = (FORMAT_MAJOR, FORMAT_MINOR)
    #: "bin" or "hbm" (the magic the file carries).
    kind: str = "bin"
    _by_name: Dict[str, model_pb2.Model] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._by_name = {m.name: m for m in self.manifest.models}

    @property
    def model_names(self) -> List[str]:
        return [m.name for m in self.manifest.models]

    def model(self, name: Optional[str] = None) -> model_pb2.Model:
        """The model called ``name``; with no name, the only model in the file."""
        return select_model(self._by_name, name, self.source)


T = TypeVar("T")


def select_model(models: Mapping[str, T], name: Optional[str], where: str) -> T:
    """The model called ``name`` among ``models`` (found in ``where``); with no
    name, the only one. A name that is not there, or no name when there are
    several, is a NotFound naming the models there are."""
    if not name:
        if len(models) != 1:
            raise NotFound(f"{len(models)} models in {where} ({_names(models)}); choose one by name",
                           subject="model_name")
        return next(iter(models.values()))
    try:
        return models[name]
    except KeyError:
        raise NotFound(f"model '{name}' is not in {where} (models there: {_names(models)})") from None


def _names(models: Mapping) -> str:
    """The models' names for an error (only then: this is on every infer call's path)."""
    return ", ".join(models) or "none"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Union[str, os.PathLike], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def encode_bin(
    models: Iterable[model_pb2.Model],
    blobs: Dict[str, bytes],
    packed: bool = False,
    kind: str = "bin",
) -> bytes:
    """Serialize models and their blobs into `.bin` bytes.

    Every blob a plan step names must be in ``blobs``; unreferenced blobs are
    an error too, so a file never carries dead weight.
    """
    models = list(models)
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise InvalidModelFile(f"duplicate model names in one file: {names}")
    referenced = {s.blob for m in models for s in m.plan if s.blob}
    missing = referenced - blobs.keys()
    if missing:
        raise InvalidModelFile(f"plan steps name blobs that were not given: {sorted(missing)}")
    unused = blobs.keys() - referenced
    if unused:
        raise InvalidModelFile(f"blobs no plan step uses: {sorted(unused)}")

    manifest = model_pb2.BinManifest(packed=packed, producer=f"bpuemu {__version__}")
    manifest.models.extend(models)
    return _encode(KINDS[kind][0], (FORMAT_MAJOR, FORMAT_MINOR), manifest, blobs)


def _encode(magic: bytes, version, manifest, blobs: Dict[str, bytes]) -> bytes:
    """Header, manifest (its ``blobs`` filled in here) and the blob area, blobs in name order."""
    offset = 0
    ordered = sorted(blobs)
    for name in ordered:
        data = blobs[name]
        manifest.blobs.add(name=name, offset=offset, size=len(data), sha256=hashlib.sha256(data).digest())
        offset += len(data)
    mbytes = manifest.SerializeToString(deterministic=True)
    header = _HEADER.pack(magic, version[0], version[1], 0, len(mbytes), hashlib.sha256(mbytes).digest())
    return b"".join([header, mbytes] + [blobs[n] for n in ordered])


def write_bin(
    path: Union[str, os.PathLike],
    models: Iterable[model_pb2.Model],
    blobs: Dict[str, bytes],
    packed: bool = False,
) -> str:
    """Write a `.bin` atomically (temp file + rename); returns its SHA-256."""
    data = encode_bin(models, blobs, packed=packed)
    write_file_atomic(path, data)
    return sha256_hex(data)


def write_hbm(path: Union[str, os.PathLike], models: Iterable[model_pb2.Model], blobs: Dict[str, bytes]) -> str:
    """Write a `.hbm` (the `.bin`'s manifest and blobs under the `.hbm` magic) atomically; returns its SHA-256."""
    data = encode_bin(models, blobs, kind="hbm")
    write_file_atomic(path, data)
    return sha256_hex(data)


def _bad(source: str, kind: str):
    def bad(what: str) -> InvalidModelFile:
        return InvalidModelFile(f"{source}: {what}", hint=f"re-create it with {KINDS[kind][2]} or copy it again")
    return bad


def _split(data: bytes, source: str, kinds, version) -> tuple:
    """Header checks shared by every kind: (kind, (major, minor), manifest bytes, end of manifest).

    ``kinds``: the kinds the caller reads, the first one naming the file in messages.
    """
    bad = _bad(source, kinds[0])
    what = KINDS[kinds[0]][1]
    if not data:
        raise bad(f"not a bpuemu {what} (the file is empty)")
    if len(data) < HEADER_SIZE:
        if not any(KINDS[k][0].startswith(data[:8]) for k in kinds):
            raise bad(f"not a bpuemu {what} (wrong magic bytes)")
        raise bad(f"truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, major, minor, _flags, mlen, msha = _HEADER.unpack_from(data)
    kind = _KIND_OF_MAGIC.get(magic)
    if kind not in kinds:
        if kind is not None:
            raise bad(f"is a bpuemu {KINDS[kind][1]}, not a {what}")
        raise bad(f"not a bpuemu {what} (magic {magic!r}, expected {KINDS[kinds[0]][0]!r})")
    if major > version[0]:
        raise IncompatibleVersion(
            f"{source}: {'model' if kind == 'bin' else KINDS[kind][1]} format {major}.{minor} is newer than "
            f"this runtime reads ({version[0]}.x, bpuemu {__version__})",
            hint="upgrade bpuemu where the model is loaded, or convert with a matching toolchain",
        )
    end = HEADER_SIZE + mlen
    if end > len(data):
        raise bad(f"truncated: manifest needs {end} bytes, file has {len(data)}")
    mbytes = data[HEADER_SIZE:end]
    if hashlib.sha256(mbytes).digest() != msha:
        raise bad("corrupt: manifest checksum mismatch")
    return kind, (major, minor), mbytes, end


def _parse(manifest, mbytes: bytes, bad) -> None:
    try:
        manifest.ParseFromString(mbytes)
    except Exception as exc:  # protobuf raises DecodeError; its text is not for users
        raise bad(f"corrupt: manifest does not parse ({type(exc).__name__})") from None


def _blobs(data: bytes, end: int, refs, bad) -> Dict[str, bytes]:
    """The verified blobs the manifest's BlobRefs name; nothing may trail them."""
    blobs = {}
    area = memoryview(data)[end:]
    for ref in refs:
        if ref.offset + ref.size > len(area):
            raise bad(
                f"truncated: blob '{ref.name}' ends at byte {end + ref.offset + ref.size}, "
                f"file has {len(data)}"
            )
        blob = bytes(area[ref.offset : ref.offset + ref.size])
        if hashlib.sha256(blob).digest() != ref.sha256:
            raise bad(f"corrupt: blob '{ref.name}' checksum mismatch")
        blobs[ref.name] = blob
    expected = end + sum(r.size for r in refs)
    if len(data) != expected:
        raise bad(f"{len(data) - expected} unexpected trailing bytes")
    return blobs


def decode_bin(data: bytes, source: str = "<bytes>") -> BinFile:
    """Parse and verify `.bin` (or `.hbm`) bytes."""
    kind, version, mbytes, end = _split(data, source, ("bin", "hbm"), (FORMAT_MAJOR, FORMAT_MINOR))
    bad = _bad(source, kind)
    manifest = model_pb2.BinManifest()
    _parse(manifest, mbytes, bad)
    if not manifest.models:
        raise bad("holds no model (its manifest lists none)")
    blobs = _blobs(data, end, manifest.blobs, bad)
    for model in manifest.models:
        for step in model.plan:
            if step.blob and step.blob not in blobs:
                raise bad(f"model '{model.name}' step '{step.name}' names missing blob '{step.blob}'")
    return BinFile(manifest, blobs, sha256_hex(data), source, version, kind)


def _read(path: Union[str, os.PathLike], what: str) -> bytes:
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise NotFound(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise InvalidModelFile(f"{path} is a directory, not a {what}") from None
    except PermissionError:
        raise InvalidModelFile(f"cannot read {path}: permission denied") from None


def read_bin(path: Union[str, os.PathLike]) -> BinFile:
    """Read and verify a `.bin` (or `.hbm`) file."""
    return decode_bin(_read(path, ".bin model"), source=os.fspath(path))


# --- .bc: the fixed-point model -------------------------------------------------------------------

BC_MODEL_BLOB = "quantized_model.onnx"


@dataclass
class BcFile:
    """A parsed `.bc`: its FixedPointModel manifest and the quantized ONNX model's bytes."""

    manifest: model_pb2.FixedPointModel
    onnx_bytes: bytes
    sha256: str
    source: str = "<bytes>"
    format_version: tuple = BC_FORMAT


def encode_bc(manifest: model_pb2.FixedPointModel, onnx_bytes: bytes) -> bytes:
    """`.bc` bytes: ``manifest`` (its model_blob, blobs and producer filled in here) and the ONNX model."""
    m = model_pb2.FixedPointModel()
    m.CopyFrom(manifest)
    m.model_blob = BC_MODEL_BLOB
    m.producer = f"bpuemu {__version__}"
    del m.blobs[:]
    return _encode(BC_MAGIC, BC_FORMAT, m, {BC_MODEL_BLOB: onnx_bytes})


def write_bc(path: Union[str, os.PathLike], manifest: model_pb2.FixedPointModel, onnx_bytes: bytes) -> str:
    """Write a `.bc` atomically; returns its SHA-256."""
    data = encode_bc(manifest, onnx_bytes)
    write_file_atomic(path, data)
    return sha256_hex(data)


def decode_bc(data: bytes, source: str = "<bytes>") -> BcFile:
    """Parse and verify `.bc` bytes."""
    _, version, mbytes, end = _split(data, source, ("bc",), BC_FORMAT)
    bad = _bad(source, "bc")
    manifest = model_pb2.FixedPointModel()
    _parse(manifest, mbytes, bad)
    blobs = _blobs(data, end, manifest.blobs, bad)
    if manifest.model_blob not in blobs:
        raise bad(f"names missing blob '{manifest.model_blob}'")
    return BcFile(manifest, blobs[manifest.model_blob], sha256_hex(data), source, version)


def read_bc(path: Union[str, os.PathLike]) -> BcFile:
    """Read and verify a `.bc` file."""
    return decode_bc(_read(path, ".bc fixed-point model"), source=os.fspath(path))

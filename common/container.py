"""Reader and writer of the `.bin` hybrid heterogeneous model container.

Layout (the proto/bpuemu/board/v1/model.proto header has the same table):

    offset  size  field
    0       8     magic b"BPUEMUBN"
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
_HEADER = struct.Struct("<8sHHIQ32s")
HEADER_SIZE = _HEADER.size  # 56


@dataclass
class BinFile:
    """A parsed `.bin`: its manifest and its verified blobs."""

    manifest: model_pb2.BinManifest
    blobs: Dict[str, bytes]
    sha256: str
    source: str = "<bytes>"
    format_version: tuple = (FORMAT_MAJOR, FORMAT_MINOR)
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
    offset = 0
    ordered = sorted(blobs)
    for name in ordered:
        data = blobs[name]
        manifest.blobs.add(name=name, offset=offset, size=len(data), sha256=hashlib.sha256(data).digest())
        offset += len(data)
    mbytes = manifest.SerializeToString(deterministic=True)
    header = _HEADER.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(mbytes), hashlib.sha256(mbytes).digest())
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


def decode_bin(data: bytes, source: str = "<bytes>") -> BinFile:
    """Parse and verify `.bin` bytes."""

    def bad(what: str) -> InvalidModelFile:
        return InvalidModelFile(f"{source}: {what}", hint="re-create it with hb_mapper makertbin or copy it again")

    if not data:
        raise bad("not a bpuemu .bin model (the file is empty)")
    if len(data) < HEADER_SIZE:
        if not data.startswith(MAGIC[: len(data)]):
            raise bad("not a bpuemu .bin model (wrong magic bytes)")
        raise bad(f"truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, major, minor, _flags, mlen, msha = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise bad(f"not a bpuemu .bin model (magic {magic!r}, expected {MAGIC!r})")
    if major > FORMAT_MAJOR:
        raise IncompatibleVersion(
            f"{source}: model format {major}.{minor} is newer than this runtime reads "
            f"({FORMAT_MAJOR}.x, bpuemu {__version__})",
            hint="upgrade bpuemu where the model is loaded, or convert with a matching toolchain",
        )
    end = HEADER_SIZE + mlen
    if end > len(data):
        raise bad(f"truncated: manifest needs {end} bytes, file has {len(data)}")
    mbytes = data[HEADER_SIZE:end]
    if hashlib.sha256(mbytes).digest() != msha:
        raise bad("corrupt: manifest checksum mismatch")
    manifest = model_pb2.BinManifest()
    try:
        manifest.ParseFromString(mbytes)
    except Exception as exc:  # protobuf raises DecodeError; its text is not for users
        raise bad(f"corrupt: manifest does not parse ({type(exc).__name__})") from None
    if not manifest.models:
        raise bad("holds no model (its manifest lists none)")
    blobs = {}
    area = memoryview(data)[end:]
    for ref in manifest.blobs:
        if ref.offset + ref.size > len(area):
            raise bad(
                f"truncated: blob '{ref.name}' ends at byte {end + ref.offset + ref.size}, "
                f"file has {len(data)}"
            )
        blob = bytes(area[ref.offset : ref.offset + ref.size])
        if hashlib.sha256(blob).digest() != ref.sha256:
            raise bad(f"corrupt: blob '{ref.name}' checksum mismatch")
        blobs[ref.name] = blob
    expected = end + sum(r.size for r in manifest.blobs)
    if len(data) != expected:
        raise bad(f"{len(data) - expected} unexpected trailing bytes")
    for model in manifest.models:
        for step in model.plan:
            if step.blob and step.blob not in blobs:
                raise bad(f"model '{model.name}' step '{step.name}' names missing blob '{step.blob}'")
    return BinFile(manifest, blobs, sha256_hex(data), source, (major, minor))


def read_bin(path: Union[str, os.PathLike]) -> BinFile:
    """Read and verify a `.bin` file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise NotFound(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise InvalidModelFile(f"{path} is a directory, not a .bin model") from None
    except PermissionError:
        raise InvalidModelFile(f"cannot read {path}: permission denied") from None
    return decode_bin(data, source=path)

"""hb_pack: several `.bin` models in one file.

Model names are kept; blob names are not unique across files (every compile
numbers its pieces ``000_...``), so each blob is renamed ``<model>__<blob>``
and the plan steps are pointed at the new names. The result is marked
``packed``; a packed file is never packed again (the seed's message).
"""
import os
from typing import Dict, List, Sequence, Tuple

from bpuemu.common.container import BinFile, read_bin, write_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2


class AlreadyPacked(InvalidInput):
    def __init__(self, path: str):
        super().__init__(f"model: {path} is a packed model, it can not be packed again!")


def blob_name(model_name: str, blob: str) -> str:
    return f"{model_name}__{blob}"


def pack_models(sources: Sequence[Tuple[str, BinFile]]) -> Tuple[List[model_pb2.Model], Dict[str, bytes]]:
    """The models and blobs of one packed file, from (path, BinFile) pairs."""
    if len(sources) < 2:
        raise InvalidInput(f"hb_pack needs at least two models to pack, got {len(sources)}")
    models: List[model_pb2.Model] = []
    blobs: Dict[str, bytes] = {}
    origin: Dict[str, str] = {}
    for path, binfile in sources:
        if binfile.manifest.packed:
            raise AlreadyPacked(path)
        for m in binfile.manifest.models:
            if m.name in origin:
                raise InvalidInput(f"model name '{m.name}' is in both {origin[m.name]} and {path}; "
                                   "a packed file needs distinct names",
                                   hint="rebuild one of them with another output_model_file_prefix")
            origin[m.name] = path
            copy = model_pb2.Model()
            copy.CopyFrom(m)
            for step in copy.plan:
                if step.blob:
                    new = blob_name(m.name, step.blob)
                    blobs[new] = binfile.blobs[step.blob]
                    step.blob = new
            models.append(copy)
    return models, blobs


def pack_files(paths: Sequence[str], output: str) -> List[str]:
    """Pack ``paths`` into ``output``; returns the model names, in order."""
    sources = [(p, read_bin(p)) for p in paths]
    models, blobs = pack_models(sources)
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise InvalidInput(f"cannot write {output}: directory {out_dir} does not exist")
    write_bin(output, models, blobs, packed=True)
    return [m.name for m in models]

"""A repro bundle: one archive that reproduces an hb_verifier comparison on another machine.

    hb_verifier -m q.onnx,m.bin -s True -b grpc://BOARD -i x.bin --save-repro DIR   # writes DIR/<model>_repro_<time>.tar.gz
    bpuemu-repro run ARCHIVE [-b BOARD]   # re-runs it here (quanti.onnx, the simulator) and on BOARD

The archive (gzip'd tar) holds:

- ``manifest.json``: the bundle format (``BUNDLE_FORMAT``), the bpuemu version that wrote it, the model's
  name and march, the comparison settings (digits, lsb), each side (label, kind, description, platform and,
  for a board, its bpuemu, runtime, arch, onnxruntime and timing mode), the inputs (name, dtype, shape), the
  verifier's report, and the SHA-256 of every other file;
- ``models/``: the `.bin` and the quantized ONNX compared (and the conversion yaml when one sits beside the
  `.bin` with the model's name);
- ``inputs/<i>.bin``: each input as raw input_type_rt bytes (what ``hb_verifier -i`` reads);
- ``outputs/<side>/<i>.npy``: each side's outputs, in model output order.

Reading refuses, with one line each: a file that is not a gzip'd tar, members other than regular files with
plain relative names, a member over ``MAX_MEMBER_BYTES``, a manifest that does not parse, a file whose
SHA-256 is not the manifest's, and a bundle of a newer format than this bpuemu reads. Members are read into
memory: nothing is extracted to a path the archive names.
"""
import datetime
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.errors import IncompatibleVersion, InvalidInput
from bpuemu.common.version import __version__
from bpuemu.host.verifier.core import QUANTI, SIM, VerifyOptions, verify

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
MAX_MEMBER_BYTES = 4 << 30
_MEMBER_RE = re.compile(r"^(manifest\.json|models/[^/]+|inputs/\d+\.bin|outputs/\d+/\d+\.npy)$")

QUANTI_KIND, SIM_KIND, BOARD_KIND = "quanti", "sim", "board"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


def _side_kind(run) -> str:
    return QUANTI_KIND if run.is_quanti else SIM_KIND if run.info.label == SIM else BOARD_KIND


def write_bundle(directory: str, options, report) -> str:
    """Write the bundle of one verification (``verify``'s options and report) into ``directory``; returns its path."""
    model, inputs, runs, boards = report.model, report.input_data, report.runs, report.board_facts
    files: Dict[str, bytes] = {}
    models = {}
    for role, path in (("bin", options.bin_model), ("quanti", options.quanti_model)):
        if path:
            with open(path, "rb") as f:
                files[f"models/{os.path.basename(path)}"] = f.read()
            models[role] = os.path.basename(path)
    yaml_path = os.path.join(os.path.dirname(os.path.abspath(options.bin_model)), f"{model.name}.yaml")
    if os.path.isfile(yaml_path):
        with open(yaml_path, "rb") as f:
            files[f"models/{os.path.basename(yaml_path)}"] = f.read()
        models["yaml"] = os.path.basename(yaml_path)
    input_meta = []
    for i, x in enumerate(inputs):
        data = np.ascontiguousarray(x.data)
        files[f"inputs/{i}.bin"] = data.tobytes()
        input_meta.append({"name": x.name, "dtype": data.dtype.name, "shape": list(data.shape), "source": x.source,
                           "file": f"inputs/{i}.bin"})
    sides = []
    for s, run in enumerate(runs):
        outputs = []
        for o, (name, value) in enumerate(run.outputs.items()):
            files[f"outputs/{s}/{o}.npy"] = _npy(value)
            outputs.append({"name": name, "file": f"outputs/{s}/{o}.npy"})
        sides.append({"label": run.info.label, "kind": _side_kind(run), "description": run.info.description,
                      "platform": run.info.platform, "board": boards.get(run.info.label, {}), "outputs": outputs})
    manifest = {
        "bpuemu_repro": BUNDLE_FORMAT, "bpuemu": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model_name": model.name, "march": getattr(model, "march", ""), "models": models,
        "digits": options.digits, "lsb": options.lsb, "inputs": input_meta, "sides": sides,
        "report": report.to_dict(), "files": {name: _sha(data) for name, data in sorted(files.items())},
    }
    files[MANIFEST] = json.dumps(manifest, indent=1).encode()
    os.makedirs(directory, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(directory, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', model.name)}_repro_{stamp}.tar.gz")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [MANIFEST] + sorted(n for n in files if n != MANIFEST):
            member = tarfile.TarInfo(name)
            member.size = len(files[name])
            member.mode = 0o644
            tar.addfile(member, io.BytesIO(files[name]))
    write_file_atomic(path, buf.getvalue())
    return path


# --- reading ---------------------------------------------------------------------------------

@dataclass
class Bundle:
    path: str
    manifest: dict
    files: Dict[str, bytes]

    def array(self, name: str) -> np.ndarray:
        return np.load(io.BytesIO(self.files[name]), allow_pickle=False)


def read_bundle(path: str) -> Bundle:
    """The bundle at ``path``, checked (see the module docstring); one-line errors otherwise."""
    def corrupt(what: str) -> InvalidInput:
        return InvalidInput(f"{path}: not a usable repro bundle: {what}",
                            hint="write it again with hb_verifier ... --save-repro DIR")

    if not os.path.isfile(path):
        raise InvalidInput(f"repro bundle not found: {path}")
    files: Dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                if not member.isfile() or not _MEMBER_RE.match(member.name):
                    raise corrupt(f"unexpected member '{member.name[:80]}'")
                if member.size > MAX_MEMBER_BYTES:
                    raise corrupt(f"member '{member.name}' is {member.size} bytes")
                if member.name in files:
                    raise corrupt(f"member '{member.name}' appears twice")
                files[member.name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise corrupt(f"{type(exc).__name__}: {str(exc)[:120]}") from None
    if MANIFEST not in files:
        raise corrupt("it has no manifest.json")
    try:
        manifest = json.loads(files[MANIFEST])
        version = int(manifest["bpuemu_repro"])
    except (ValueError, KeyError, TypeError) as exc:
        raise corrupt(f"its manifest does not parse ({type(exc).__name__})") from None
    if version > BUNDLE_FORMAT:
        raise IncompatibleVersion(f"{path}: repro bundle format {version} (written by bpuemu {manifest.get('bpuemu', '?')}) "
                                  f"is newer than this bpuemu {__version__} reads (format {BUNDLE_FORMAT})",
                                  hint="run it with a bpuemu at least as new as the one that wrote it")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or set(listed) != set(files) - {MANIFEST}:
        raise corrupt("its files are not the ones its manifest lists")
    for name, digest in listed.items():
        if _sha(files[name]) != digest:
            raise corrupt(f"{name} does not match its SHA-256")
    return Bundle(path, manifest, files)


# --- running again ---------------------------------------------------------------------------

@dataclass
class Reproduction:
    """One side run again, against the bundle's side of the same kind."""

    label: str
    against: str
    reproduced: bool
    detail: str

    def line(self) -> str:
        verdict = "reproduced bit for bit" if self.reproduced else f"DIFFERS: {self.detail}"
        return f"{self.label} (against the bundle's {self.against}): {verdict}"


def _compare(saved: Dict[str, np.ndarray], got: Dict[str, np.ndarray]) -> str:
    """'' when every output is bit-identical, else what differs first."""
    for name, want in saved.items():
        have = got.get(name)
        if have is None:
            return f"output '{name}' is missing"
        have = np.asarray(have)
        if have.dtype != want.dtype or have.shape != want.shape:
            return f"output '{name}' is {have.dtype.name} {list(have.shape)}, the bundle's {want.dtype.name} {list(want.shape)}"
        if have.tobytes() != want.tobytes():
            differ = int(np.count_nonzero(have != want))
            diff = float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64))))
            return f"output '{name}': {differ} of {want.size} values differ, max abs {diff:g}"
    return ""


def rerun(bundle: Bundle, board: str = "", echo: Callable[[str], None] = lambda line: None,
          token: Optional[str] = None, tls=None, ssh=None) -> List[Reproduction]:
    """Run the bundle's comparison again on this host (quanti.onnx, the simulator) and, given ``board`` (a form
    hb_verifier -b takes, normalized to ssh:// or grpc://), there; each side against the bundle's side of its kind."""
    m = bundle.manifest
    sides = m["sides"]
    saved = {i: {o["name"]: bundle.array(o["file"]) for o in side["outputs"]} for i, side in enumerate(sides)}
    with tempfile.TemporaryDirectory(prefix="bpuemu-repro-") as tmp:
        paths = {}
        for role, name in m["models"].items():
            paths[role] = os.path.join(tmp, name)
            with open(paths[role], "wb") as f:
                f.write(bundle.files[f"models/{name}"])
        specs = []
        for x in m["inputs"]:
            p = os.path.join(tmp, os.path.basename(x["file"]))
            with open(p, "wb") as f:
                f.write(bundle.files[x["file"]])
            specs.append(f"{x['name']}:{p}")
        options = VerifyOptions(bin_model=paths["bin"], quanti_model=paths.get("quanti", ""), model_name=m["model_name"],
                                run_sim=True, boards=[board] if board else [], input_files=",".join(specs),
                                digits=int(m.get("digits", 5)), lsb=m.get("lsb"), token=token, tls=tls, ssh=ssh)
        report = verify(options, echo=echo)
    outcomes = []
    for run in report.runs:
        kind = QUANTI_KIND if run.info.label == QUANTI else SIM_KIND if run.info.label == SIM else BOARD_KIND
        match = next((i for i, s in enumerate(sides) if s["kind"] == kind), None)
        label = run.info.label if kind != BOARD_KIND else f"board {board}"
        if match is None:
            outcomes.append(Reproduction(label, "(none)", False, f"the bundle has no {kind} side to compare with"))
            continue
        detail = _compare(saved[match], run.outputs)
        outcomes.append(Reproduction(label, sides[match]["label"], not detail, detail))
    return outcomes

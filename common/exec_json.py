"""``hrt_model_exec --json``: the board tool's machine-readable output, part of the wire contract.

With ``--json`` hrt_model_exec writes exactly one JSON document to stdout
instead of its console text (errors still go to stderr as ``ERROR ...`` /
``Hint: ...`` lines, exit status non-zero). Programs that drive the tool --
the host's SSH transport first of all -- read this instead of the console.
Every document has::

    {"format": "bpuemu.hrt_model_exec", "version": 1, "command": "model_info" | "infer" | "perf",
     "board": {"arch": "aarch64", "onnxruntime_version": "1.22.0", "bpuemu_version": "0.1.0"},
     "load_ms": 12.5, ...}

and, per command:

* ``model_info``: ``"models": [{"name", "inputs": [tensor names], "outputs": [tensor names]}]``;
* ``infer``: ``"model"``, ``"latency_ms"`` (one per frame), ``"outputs"`` (model
  output order) and ``"intermediates"`` (with --dump_intermediate), each a list
  of tensors ``{"name", "dtype", "shape", "files"}``: ``dtype`` a numpy dtype
  name, ``files`` the dumps written for it (--enable_dump / --dump_intermediate),
  relative to --dump_path, ``.bin`` (raw C-order bytes) before ``.txt``;
* ``perf``: ``"model"``, ``"result"`` (thread_num, frame_count, run_time_ms,
  total_latency_ms, average_latency_ms, fps, p50_ms, p90_ms, p99_ms, core_id,
  model_name: what this run measured on the machine that ran it), ``"profiler_files"``
  (relative to --profile_path; empty without profiling) and ``"x5"``: what an RDK X5
  would show for the same thread_num and frame_count, from the X5 timing the `.bin`
  stores (bpuemu.common.x5_timing): thread_num, frame_count, latency_ms, fps,
  latency_1thread_ms, bpu_ms, cpu_ms (per frame), estimate_line (makertbin's),
  parameters (the parameter set it was computed with), steps_us (plan step ->
  modeled us) and task_overhead_us; or ``{"error": "no X5 timing in this model,
  rebuild with makertbin"}`` for a `.bin` made before bpuemu had the model.

``version`` is EXEC_JSON_VERSION (bpuemu.common.version); within a version
fields are only added, so a reader ignores fields it does not know and refuses
a document from a newer version.
"""
import json
from typing import Dict, Optional, Sequence

import numpy as np

from bpuemu.common.errors import IncompatibleVersion
from bpuemu.common.version import EXEC_JSON_VERSION, __version__

FORMAT = "bpuemu.hrt_model_exec"


def document(command: str, arch: str, onnxruntime_version: str, load_ms: float, **fields) -> str:
    """One ``--json`` document (a single line of text)."""
    doc = {"format": FORMAT, "version": EXEC_JSON_VERSION, "command": command,
           "board": {"arch": arch, "onnxruntime_version": onnxruntime_version, "bpuemu_version": __version__},
           "load_ms": round(float(load_ms), 3), **fields}
    return json.dumps(doc, separators=(",", ":"))


def tensor(name: str, array: np.ndarray, files: Sequence[str] = ()) -> dict:
    """A tensor entry: what a reader needs to rebuild it from its ``.bin`` dump."""
    array = np.asarray(array)
    return {"name": name, "dtype": array.dtype.name, "shape": [int(d) for d in array.shape], "files": list(files)}


def read_document(text: str, command: str, source: str = "hrt_model_exec") -> Dict:
    """Parse the ``--json`` document of ``command``; IncompatibleVersion when it is not one this side reads."""
    hint = "install the same bpuemu version on host and board"
    try:
        doc = json.loads(text)
    except ValueError:
        first = (text.strip().splitlines() or ["nothing"])[0][:120]
        raise IncompatibleVersion(f"{source} did not answer with a --json document: {first!r}", hint=hint) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IncompatibleVersion(f"{source} answered with a JSON document that is not {FORMAT}", hint=hint)
    version = doc.get("version")
    if not isinstance(version, int) or version > EXEC_JSON_VERSION:
        raise IncompatibleVersion(f"{source} writes --json version {version}; this side reads up to {EXEC_JSON_VERSION}",
                                  hint=hint)
    if doc.get("command") != command:
        raise IncompatibleVersion(f"{source} answered '{doc.get('command')}' to '{command}'", hint=hint)
    return doc


def dump_file(entry: Dict, ext: str = ".bin") -> Optional[str]:
    """The entry's dump with extension ``ext``, or None when none was written."""
    return next((f for f in entry.get("files", []) if f.endswith(ext)), None)


def entry_dtype_shape(entry: Dict):
    """(numpy dtype, shape tuple) of a tensor entry."""
    return np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"])


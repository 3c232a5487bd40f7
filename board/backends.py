"""One interface over where a model runs: in this process, or on a board.

``LocalBackend`` runs the runtime in-process (the x86 simulator on a host; the
real thing when hrt_model_exec runs on a board). ``RemoteBackend`` drives a
board daemon over gRPC. hrt_model_exec and hb_verifier talk only to this
interface, so the same command line works either way and outputs compare bit
for bit.

    with open_backend(["m.bin"], board="127.0.0.1:9473") as be:
        h = be.model("")                # the only model, or by name
        result = h.infer([x])

A third transport, SSH (run the board's own hrt_model_exec over SSH), lives on
the host side because it needs paramiko; it plugs in through the
``bpuemu.transports`` entry point group (``ssh = "bpuemu.host.clients.ssh:
SshBackend"``), so a board install neither imports nor needs it.
"""
import platform
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from bpuemu.common.container import select_model
from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.board.runtime import InferResult, LoadedModel, Runtime, run_frames
from bpuemu.board.runtime.model import ModelDescription
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport, run_perf


class ModelHandle(ModelDescription):
    """A model ready to infer and perf, wherever it runs."""

    def infer(self, inputs: Sequence[np.ndarray], frame_count: int = 1, dump_intermediate: bool = False) -> InferResult:
        raise NotImplementedError

    def perf(self, config: PerfConfig, inputs: Sequence[np.ndarray] = (), progress=None) -> PerfReport:
        raise NotImplementedError


class LocalModel(ModelHandle):
    def __init__(self, loaded: LoadedModel):
        super().__init__(loaded.model)
        self.loaded = loaded

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        return run_frames(self.loaded, inputs, frame_count, dump_intermediate)

    def perf(self, config, inputs=(), progress=None):
        return run_perf(self.loaded, inputs, config, progress=progress)


class RemoteModel(ModelHandle):
    def __init__(self, client: BoardClient, sha: str, model: model_pb2.Model):
        super().__init__(model)
        self.client, self.sha = client, sha

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        return self.client.infer(self.sha, self.name, list(inputs), self.input_names, dump_intermediate, frame_count)

    def perf(self, config, inputs=(), progress=None):
        return self.client.perf(self.sha, self.name, config, list(inputs), progress=progress)


@dataclass(frozen=True)
class Platform:
    """What decides bit-exactness across machines: CPU arch and onnxruntime version."""

    arch: str
    onnxruntime_version: str

    def __str__(self) -> str:
        return f"{self.arch}, onnxruntime {self.onnxruntime_version}"


def local_platform() -> Platform:
    from bpuemu.board.messages import onnxruntime_version

    return Platform(platform.machine(), onnxruntime_version())


class Backend:
    description = ""
    load_ms = 0.0

    def __init__(self):
        self.models: Dict[str, ModelHandle] = {}

    @property
    def platform(self) -> Platform:
        """Where the models run (this machine for the local runtime)."""
        return local_platform()

    @property
    def model_names(self) -> List[str]:
        return list(self.models)

    def model(self, name: Optional[str] = None) -> ModelHandle:
        """The model called ``name``; with no name, the only one (NotFound otherwise)."""
        return select_model(self.models, name, "the given model files")

    def _add(self, handle: ModelHandle) -> None:
        if handle.name in self.models:
            raise InvalidInput(f"model name '{handle.name}' appears twice in the given model files")
        self.models[handle.name] = handle

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalBackend(Backend):
    def __init__(self, model_files: Sequence[str], intra_op_threads: int = 1):
        super().__init__()
        self.runtime = Runtime(intra_op_threads)
        self.load_ms = self._timed_load(model_files)
        self.description = f"local runtime ({self.platform})"

    def _timed_load(self, files) -> float:
        t0 = time.perf_counter()
        self.runtime.load(list(files))
        for loaded in self.runtime.models.values():
            self._add(LocalModel(loaded))
        return (time.perf_counter() - t0) * 1e3


class RemoteBackend(Backend):
    def __init__(self, target: str, model_files: Sequence[str], token: Optional[str] = None, tls=None,
                 deadlines: Optional[Deadlines] = None, client_name: str = "hrt_model_exec"):
        super().__init__()
        # tls: a bpuemu.board.security.TlsConfig, or None (then BPUEMU_TLS_*, else plain TCP)
        self.client = BoardClient(target, token=token, client_name=client_name, tls=tls,
                                  deadlines=deadlines)
        try:
            info = self.client.info
            self.description = f"board {self.client.target} ({info.arch}, bpuemu {info.daemon_version})"
            t0 = time.perf_counter()
            for path in model_files:
                sha = self.client.ensure_model(path)
                for name in self.client.load(sha):
                    self._add(RemoteModel(self.client, sha, self.client.model_info(sha, name)))
            self.load_ms = (time.perf_counter() - t0) * 1e3
        except BaseException:
            self.client.close()
            raise

    @property
    def platform(self) -> Platform:
        info = self.client.info
        return Platform(info.arch, info.onnxruntime_version)

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class TransportRequest:
    """A board reached through a transport plugin: the plugin's name, the target, and its own settings.

    The board knows no plugin's option types (SSH's live on the host, with
    paramiko); the plugin's ``open(request, model_files)`` turns ``settings``
    into them.
    """

    transport: str  # the plugin's name in the bpuemu.transports group, e.g. "ssh"
    target: str  # e.g. "root@board:22"
    settings: Mapping[str, object] = field(default_factory=dict)


#: Entry point group where host packages register extra transports.
TRANSPORT_GROUP = "bpuemu.transports"


def load_transport(name: str):
    """The Backend class registered as transport ``name`` (e.g. "ssh")."""
    from importlib.metadata import entry_points

    eps = entry_points()
    group = eps.select(group=TRANSPORT_GROUP) if hasattr(eps, "select") else eps.get(TRANSPORT_GROUP, [])
    hint = "install the host side: pip install 'bpuemu[host]' (paramiko)"
    found = [ep for ep in group if ep.name == name]
    if not found:
        raise InvalidInput(f"the {name} transport is not installed here", hint=hint)
    try:
        return found[0].load()
    except ImportError as exc:
        raise InvalidInput(f"the {name} transport cannot be loaded: {exc}", hint=hint) from None


def open_backend(model_files: Sequence[str], board: Optional[str] = None, token: Optional[str] = None,
                 ssh: Optional[TransportRequest] = None, tls=None) -> Backend:
    files = [f for f in model_files if f]
    if not files:
        raise InvalidInput("no model file given", subject="model_file")
    if ssh is not None:
        if board:
            raise InvalidInput("give either --board (gRPC) or --ssh, not both")
        return load_transport(ssh.transport).open(ssh, files)
    return RemoteBackend(board, files, token, tls) if board else LocalBackend(files)

"""One interface over where a model runs: in this process, or on a board.

``LocalBackend`` runs the runtime in-process (the x86 simulator on a host; the
real thing when hrt_model_exec runs on a board). ``RemoteBackend`` drives a
board daemon over gRPC. hrt_model_exec and hb_verifier talk only to this
interface, so the same command line works either way and outputs compare bit
for bit.

    with open_backend(["m.bin"], board="127.0.0.1:9473") as be:
        h = be.model("")                # the only model, or by name
        result = h.infer([x])
"""
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.proto import model_pb2
from bpuemu.board.client import BoardClient, InferResult
from bpuemu.board.runtime import LoadedModel, Runtime
from bpuemu.board.runtime.perf import PerfConfig, PerfReport, run_perf


class ModelHandle:
    """A model ready to infer and perf, wherever it runs."""

    def __init__(self, model: model_pb2.Model):
        self.model = model
        self.name = model.name
        self.input_properties = list(model.inputs)
        self.output_properties = list(model.outputs)
        self.input_names = [p.name for p in model.inputs]
        self.output_names = [p.name for p in model.outputs]

    def infer(self, inputs: Sequence[np.ndarray], frame_count: int = 1, dump_intermediate: bool = False) -> InferResult:
        raise NotImplementedError

    def perf(self, config: PerfConfig, inputs: Sequence[np.ndarray] = (), progress=None) -> PerfReport:
        raise NotImplementedError


class LocalModel(ModelHandle):
    def __init__(self, loaded: LoadedModel):
        super().__init__(loaded.model)
        self.loaded = loaded

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        latencies = []
        for i in range(max(1, frame_count)):
            t0 = time.perf_counter()
            result = self.loaded.run(list(inputs), keep_intermediate=dump_intermediate and i == frame_count - 1)
            latencies.append((time.perf_counter() - t0) * 1e3)
        outputs, inter = result if dump_intermediate else (result, {})
        return InferResult(dict(zip(self.output_names, outputs)), inter, latencies)

    def perf(self, config, inputs=(), progress=None):
        if not inputs:
            from bpuemu.common.input_types import random_rt_input

            rng = np.random.default_rng(0)
            inputs = [random_rt_input(s, rng) for s in self.model.input_specs]
        return run_perf(self.loaded, list(inputs), config, progress=progress)


class RemoteModel(ModelHandle):
    def __init__(self, client: BoardClient, sha: str, model: model_pb2.Model):
        super().__init__(model)
        self.client, self.sha = client, sha

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        return self.client.infer(self.sha, self.name, list(inputs), self.input_names, dump_intermediate, frame_count)

    def perf(self, config, inputs=(), progress=None):
        return self.client.perf(self.sha, self.name, config, list(inputs), progress=progress)


class Backend:
    description = ""

    def __init__(self):
        self.models: Dict[str, ModelHandle] = {}

    @property
    def model_names(self) -> List[str]:
        return list(self.models)

    def model(self, name: Optional[str] = None) -> ModelHandle:
        if not name:
            if len(self.models) != 1:
                raise InvalidInput(f"the model files hold {len(self.models)} models ({', '.join(self.models)}); choose one",
                                   hint="pass --model_name NAME")
            return next(iter(self.models.values()))
        try:
            return self.models[name]
        except KeyError:
            raise NotFound(f"model '{name}' is not in the given model files; they hold: {', '.join(self.models)}") from None

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
        import platform

        super().__init__()
        self.runtime = Runtime(intra_op_threads)
        self.load_ms = self._timed_load(model_files)
        self.description = f"local runtime ({platform.machine()})"

    def _timed_load(self, files) -> float:
        t0 = time.perf_counter()
        self.runtime.load(list(files))
        for loaded in self.runtime.models.values():
            self._add(LocalModel(loaded))
        return (time.perf_counter() - t0) * 1e3


class RemoteBackend(Backend):
    def __init__(self, target: str, model_files: Sequence[str], token: Optional[str] = None):
        super().__init__()
        self.client = BoardClient(target, token=token, client_name="hrt_model_exec")
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

    def close(self) -> None:
        self.client.close()


def open_backend(model_files: Sequence[str], board: Optional[str] = None, token: Optional[str] = None) -> Backend:
    files = [f for f in model_files if f]
    if not files:
        raise InvalidInput("no model file given", hint="pass --model_file FILE.bin")
    return RemoteBackend(board, files, token) if board else LocalBackend(files)

"""A loaded model: its plan turned into ready-to-run steps.

All the work that does not depend on the frame (sessions, dequantize
parameters, name lookups) happens once, at load time. ``LoadedModel.run`` is
thread-safe: each call keeps its tensors in its own table, and onnxruntime
sessions are safe to run concurrently.
"""
import logging
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common import x5_timing
from bpuemu.common.errors import BpuEmuError, InvalidInput, InvalidModelFile, without_paths
from bpuemu.common.input_types import checked_rt_input, rt_shape, to_model_input
from bpuemu.common.numerics import Dequantizer
from bpuemu.common.proto import model_pb2
from bpuemu.board.runtime.merge import chains, merge_pieces
from bpuemu.board.runtime.profiler import FrameTimes
from bpuemu.board.runtime.sessions import session_from_bytes
from bpuemu.board.runtime.validate import check_input_spec, check_plan

Kind = model_pb2.PlanStep
log = logging.getLogger(__name__)

#: The step kinds the profiler counts as BPU time.
BPU_KINDS = {Kind.BPU_SUBGRAPH}

Tensors = Dict[str, np.ndarray]

#: --timing x5 (hrt_boardd, hrt_model_exec): the modeled X5 every frame of this process waits for, or None.
_X5_CLOCK: Optional[x5_timing.X5Clock] = None
TIMINGS = ("host", "x5")


def set_timing(timing: str) -> None:
    """``x5``: every frame lasts at least its modeled X5 time, the process's frames sharing one modeled
    BPU (bpuemu.common.x5_timing.X5Clock); ``host``: as fast as this machine runs (the default)."""
    global _X5_CLOCK
    if timing not in TIMINGS:
        raise InvalidInput(f"unknown timing '{timing}' (known: {', '.join(TIMINGS)})")
    _X5_CLOCK = x5_timing.X5Clock() if timing == "x5" else None


def timing() -> str:
    return "x5" if _X5_CLOCK is not None else "host"


class Step:
    """One executable plan step: ``run(tensors)`` reads and writes the table."""

    #: True for a step that changes nothing in the table (a frame without profiling skips it).
    noop = False

    def __init__(self, spec: model_pb2.PlanStep):
        self.spec = spec
        self.name = spec.name
        self.is_bpu = spec.kind in BPU_KINDS
        self.inputs = list(spec.inputs)
        self.outputs = list(spec.outputs)

    def run(self, tensors: Tensors) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class OrtStep(Step):
    """A compiled piece (BPU subgraph, CPU op, input quantize) run by onnxruntime (``_bind``: once
    check_plan has matched the step's inputs and outputs to the piece's)."""

    def __init__(self, spec, blob: bytes, intra_op_threads: int):
        super().__init__(spec)
        self.blob = blob
        self._threads = intra_op_threads
        self._lock = threading.Lock()
        try:
            self.session = session_from_bytes(blob, intra_op_threads, piece=f"step '{spec.name[:80]}'")
        except BpuEmuError:
            raise
        except Exception as exc:  # onnxruntime's own exception types vary by version
            raise InvalidModelFile(f"step '{spec.name}': piece does not load: {without_paths(str(exc))}") from None
        _bind(self, self.session)

    def release(self) -> None:
        """Close the session (a MergedStep runs this piece on frames without dumps): it holds the piece's
        weights a second time. ``reopen`` opens it again, for profiled or dumped frames
        (LoadedModel.open_pieces), and it is closed again when the last of them ends (close_pieces)."""
        self.session = None
        self._run = self._reopen

    def reopen(self) -> None:
        with self._lock:
            if self.session is None:
                self.session = session_from_bytes(self.blob, self._threads)
                _bind(self, self.session)

    def _reopen(self, outputs, feed, run_options):
        self.reopen()
        return self._run(outputs, feed, run_options)

    def run(self, tensors):
        if self._single is not None:
            src, dst = self._single
            tensors[dst] = self._run(self.outputs, {src: tensors[src]}, None)[0]
            return
        feed = {name: tensors[name] for name in self.inputs}
        for name, value in zip(self.outputs, self._run(self.outputs, feed, None)):
            tensors[name] = value


def _bind(step, session) -> None:
    """Run ``session`` through its own binding: what InferenceSession.run checks on every call (the feed
    names the piece's inputs, no OrtValue of another device, no graph capture) holds by construction."""
    binding = getattr(session, "_sess", None)
    step._run = binding.run if binding is not None else session.run
    step._single = (step.inputs[0], step.outputs[0]) if len(step.inputs) == 1 and len(step.outputs) == 1 else None


class MergedStep:
    """Consecutive pieces of the plan run as one onnxruntime session (bpuemu.board.runtime.merge): writes
    only the tensors later steps and the model's outputs read."""

    noop = False
    run = OrtStep.run

    def __init__(self, steps: Sequence[OrtStep], session, outputs: Sequence[str]):
        self.name = "+".join(s.name for s in steps)
        self.steps = list(steps)
        self.session = session
        self.inputs = [a.name for a in session.get_inputs()]
        self.outputs = list(outputs)
        _bind(self, session)


def merge_steps(steps: Sequence[Step], outputs: Sequence[str], intra_op_threads: int) -> List:
    """``steps`` with each run of consecutive onnxruntime pieces as one MergedStep (a run that cannot be
    merged stays as it is); ``outputs``: the tensors read after the last step."""
    runs = chains(steps, lambda s: isinstance(s, OrtStep))
    frame: List = []
    for i, run in enumerate(runs):
        later = set(outputs).union(*(s.inputs for r in runs[i + 1:] for s in r))
        needed = [t for s in run for t in s.outputs if t in later]
        blob = merge_pieces([s.blob for s in run], needed) if len(run) > 1 else None
        session = None
        if blob is not None:
            try:
                session = session_from_bytes(blob, intra_op_threads)
            except Exception as exc:  # onnxruntime's own exception types vary by version
                log.debug("pieces %s run one by one: the merged graph does not load: %s", [s.name for s in run], exc)
        if session is None:
            frame.extend(run)
            continue
        frame.append(MergedStep(run, session, needed))
        for step in run:
            step.release()
    return frame


class DequantizeStep(Step):
    """``<node>_HzDequantize``: (q - zero_point) * scale, as onnxruntime computes it."""

    def __init__(self, spec):
        super().__init__(spec)
        self.dequantize = Dequantizer(spec.scale, spec.zero_point, spec.axis)

    def run(self, tensors):
        tensors[self.outputs[0]] = self.dequantize(tensors[self.inputs[0]])


class LayoutConvertStep(Step):
    """Bring tensors between the BPU's layout and the CPU's."""

    def __init__(self, spec):
        super().__init__(spec)
        self.perm = tuple(spec.perm) or None
        # No perm, written in place: the tensor already has the layout (a featuremap output's convert).
        self.noop = self.perm is None and self.inputs == self.outputs

    def run(self, tensors):
        for src, dst in zip(self.inputs, self.outputs):
            x = tensors[src]
            tensors[dst] = np.ascontiguousarray(x.transpose(self.perm) if self.perm else x)


class PreprocessStep(Step):
    """input_type_rt data -> the quantized model's input (nv12 -> yuv444, -128, layout)."""

    def __init__(self, spec, input_spec: model_pb2.InputSpec):
        super().__init__(spec)
        self.input_spec = input_spec
        self.fused = spec.fused_into_subgraph
        self._rt_shape = tuple(rt_shape(input_spec)) if self.fused else None

    def run(self, tensors):
        x = tensors[self.inputs[0]]
        if not self.fused:
            tensors[self.outputs[0]] = to_model_input(x, self.input_spec)
        elif type(x) is np.ndarray and x.dtype == np.uint8 and x.shape == self._rt_shape:
            tensors[self.outputs[0]] = x  # what the subgraph reads, as it is (the common case: one check)
        else:  # the subgraph converts; check (and reshape) what it will read, with the full messages
            tensors[self.outputs[0]] = checked_rt_input(x, self.input_spec)


def _build_step(spec, model: model_pb2.Model, blobs: Dict[str, bytes], intra_op_threads: int) -> Step:
    if spec.kind in (Kind.BPU_SUBGRAPH, Kind.CPU_OP, Kind.QUANTIZE):
        if spec.blob not in blobs:
            raise InvalidModelFile(f"step '{spec.name[:80]}' names no piece of the file (blob '{spec.blob[:80]}')")
        return OrtStep(spec, blobs[spec.blob], intra_op_threads)
    if spec.kind == Kind.DEQUANTIZE:
        return DequantizeStep(spec)
    if spec.kind == Kind.LAYOUT_CONVERT:
        return LayoutConvertStep(spec)
    if spec.kind == Kind.PREPROCESS:
        if not 0 <= spec.input_index < len(model.input_specs):
            raise InvalidModelFile(f"step '{spec.name}' names input {spec.input_index}, model has {len(model.input_specs)}")
        check_input_spec(model, model.input_specs[spec.input_index])  # before the step reads its shape
        return PreprocessStep(spec, model.input_specs[spec.input_index])
    raise InvalidModelFile(f"step '{spec.name}' has unknown kind {spec.kind}; is the runtime older than the model?")


class ModelDescription:
    """What the manifest says about a model's interface: name, tensor properties, tensor names."""

    def __init__(self, model: model_pb2.Model):
        self.model = model
        self.name = model.name
        self.input_properties = list(model.inputs)
        self.output_properties = list(model.outputs)
        self.input_names = [p.name for p in model.inputs]
        self.output_names = [p.name for p in model.outputs]


class LoadedModel(ModelDescription):
    """One model of a `.bin`, ready to run."""

    def __init__(self, model: model_pb2.Model, blobs: Dict[str, bytes], intra_op_threads: int = 1,
                 merge: bool = True):
        super().__init__(model)
        self.steps: List[Step] = [_build_step(s, model, blobs, intra_op_threads) for s in model.plan]
        check_plan(model, self.steps)
        self._fused = [s for s in self.steps if isinstance(s, PreprocessStep) and s.fused]
        self._output_tensors = list(model.output_tensors) or self.output_names
        # What a frame with dumps runs: the plan less the steps that change nothing; without dumps, the
        # same with consecutive pieces merged (``merge``).
        self._step_by_step = [s for s in self.steps if not s.noop]
        self._frame_steps = (merge_steps(self._step_by_step, self._output_tensors, intra_op_threads)
                             if merge else self._step_by_step)
        self._table_names = [f"rt:{name}" for name in self.input_names]
        self._direct = self._direct_step()
        self._closed = [p for s in self._frame_steps if isinstance(s, MergedStep) for p in s.steps]
        self._pieces_lock = threading.Lock()
        self._piece_users = 0    # open_pieces calls not yet followed by close_pieces
        self.x5_steps = x5_timing.march_steps(model) if x5_timing.has_timing(model) else None

    def open_pieces(self) -> None:
        """Open the pieces' own sessions a merge closed: profiled and dumped frames run the pieces one by one.
        Done before such a frame's clock starts (by perf before its first profiled frame, by run_frames
        before a dumped frame); each call is followed by one close_pieces."""
        with self._pieces_lock:
            try:
                for step in self._closed:
                    if step.session is None:
                        step.reopen()
            except BaseException:
                if self._piece_users == 0:   # a piece that does not load again: none stays open
                    for step in self._closed:
                        step.release()
                raise
            self._piece_users += 1

    def close_pieces(self) -> None:
        """The end of an open_pieces: when no profiled or dumped work is left, the pieces' sessions close
        again, and the model holds its weights once (a board running for weeks after one profiled perf job
        or one dump). Done after the clocks stop."""
        with self._pieces_lock:
            self._piece_users -= 1
            if self._piece_users == 0:
                for step in self._closed:
                    step.release()

    def _direct_step(self) -> Optional[Step]:
        """The frame's one onnxruntime step when a frame is only the inputs' checks (fused Preprocess steps)
        and that step, reading the inputs and writing the outputs in order: it then runs without the table."""
        if not self._frame_steps:
            return None
        *checks, last = self._frame_steps
        if (len(checks) == len(self.input_names) and all(isinstance(s, PreprocessStep) and s.fused for s in checks)
                and isinstance(last, (OrtStep, MergedStep)) and sorted(last.inputs) == sorted(self._table_names)
                and last.outputs == self._output_tensors):
            return last
        return None

    def _feed(self, inputs) -> Tensors:
        if isinstance(inputs, dict):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise InvalidInput(f"model '{self.name}' needs inputs {self.input_names}; missing {missing}")
            ordered = [inputs[n] for n in self.input_names]
        else:
            ordered = inputs if type(inputs) is list else list(inputs)
            if len(ordered) != len(self.input_names):
                raise InvalidInput(
                    f"model '{self.name}' takes {len(self.input_names)} input(s) {self.input_names}, got {len(ordered)}"
                )
        return {name: x if type(x) is np.ndarray else np.asarray(x) for name, x in zip(self._table_names, ordered)}

    def run(
        self,
        inputs,
        times: Optional[FrameTimes] = None,
        keep_intermediate: bool = False,
        submitted_ns: Optional[int] = None,
    ):
        """Run one frame.

        ``inputs`` is a list in model input order or a dict by input name, in
        input_type_rt form. Returns the outputs (list, model output order) and,
        with ``keep_intermediate``, every tensor the plan produced.
        """
        tensors = self._feed(inputs)
        x5 = _X5_CLOCK
        direct = self._direct
        if direct is not None and times is None and x5 is None and not keep_intermediate:
            for check in self._fused:
                check.run(tensors)
            return direct._run(direct.outputs, tensors, None)   # the outputs, in order
        pieces = times is not None or keep_intermediate
        if pieces:
            self.open_pieces()
        try:
            clock = time.perf_counter_ns
            start = clock()
            if x5 is not None:
                if self.x5_steps is None:
                    raise x5_timing.NoX5Timing(f"model '{self.name}': {x5_timing.NO_TIMING} (this board runs --timing x5)")
                deadline = x5.deadline_ns(self.x5_steps, submitted_ns or start)
            if times is None:
                for step in self._step_by_step if keep_intermediate else self._frame_steps:
                    step.run(tensors)
            else:
                t0 = start
                for step in self.steps:
                    step.run(tensors)
                    t1 = clock()
                    times.steps.append((step.name, step.is_bpu, (t1 - t0) / 1e6))
                    t0 = t1
                times.pending_ms = (start - (submitted_ns or start)) / 1e6
                times.running_ms = (t0 - start) / 1e6
            if x5 is not None:
                x5.wait_until(deadline)   # the frame lasts what it lasts on the X5
        finally:
            if pieces:
                self.close_pieces()
        outputs = [tensors[n] for n in self._output_tensors]
        if keep_intermediate:
            inter = {k: v for k, v in tensors.items() if not k.startswith("rt:")}
            for step in self._fused:  # the model input the subgraph made internally: dumps show it as before
                inter[step.input_spec.plan_tensor] = to_model_input(tensors[step.outputs[0]], step.input_spec)
            return outputs, inter
        return outputs

    def output_by_name(self, outputs: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
        return dict(zip(self.output_names, outputs))

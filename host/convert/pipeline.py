"""hb_mapper makertbin: float ONNX + config + calibration data -> the five artifacts.

    <prefix>_original_float_model.onnx   HzPreprocess inserted (preprocess.py)
    <prefix>_optimized_float_model.onnx  BN/constant folding, fusions (optimizer.py)
    <prefix>_calibrated_model.onnx       HzCalibration nodes holding thresholds (quant)
    <prefix>_quantized_model.onnx        standard QDQ, int8 image inputs (quant)
    <prefix>.bin                         the partitioned plan (compiler.partition + common.container)

``ConvertJob`` is everything the run needs, already validated and typed; the
yaml layer (bpuemu.host.config) and --fast-perf both build one.

The march (``ConvertJob.march``, described by ``bpuemu.common.march``) picks
the flow's artifacts: the five above for ``bayes-e`` (hb_mapper makertbin);
for a J6 march (``nash-*``, hb_compile) the quantized model is
``<prefix>_ptq_model.onnx`` and the deployable model ``<prefix>.hbm``, beside
``<prefix>_quantized_model.bc`` (``_quantized_removed_model.bc`` when nodes
were removed) and ``<prefix>_node_info.csv`` (bpuemu.host.convert.j6_artifacts).

Nothing is lost on failure: every output (the five artifacts and the
calibration_data dump) is written into a fresh staging directory inside
working_dir and renamed into place only when the whole run succeeded
(bpuemu.common.atomic.Staging). A run that fails, is interrupted or killed
leaves the previous run's artifacts byte-identical.
"""
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

from bpuemu.common.atomic import Staging, atomic_output, checkpoint
from bpuemu.common.container import write_bin
from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.common.march import March
from bpuemu.common.march import march as march_of
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import __version__
from bpuemu.host.convert.caldata import CalInput, iter_samples, to_model_inputs
from bpuemu.host.convert.optimizer import optimize
from bpuemu.host.convert.preprocess import InputPreprocess, insert_preprocess
from bpuemu.host.onnxgraph import elem_type_name, graph_inputs, has_qdq, load_onnx, name_nodes, open_session
from bpuemu.host.quant.stages import StageClock, stages_line

log = logging.getLogger("bpuemu.host.makertbin")


@dataclass(frozen=True)
class JobInput:
    pre: InputPreprocess
    shape: Tuple[int, ...]               # input_shape in input_layout_train
    input_layout_rt: str = ""
    #: compiler_parameters.input_source of this input (ddr | pyramid | resizer); "": by input_type_rt.
    input_source: str = ""
    cal: Optional[CalInput] = None


@dataclass
class ConvertJob:
    onnx_model: str                       # "" for a Caffe model (prototxt + caffe_model)
    output_model_file_prefix: str
    working_dir: str
    inputs: List[JobInput]
    prototxt: str = ""
    caffe_model: str = ""
    quant_options: object = None          # bpuemu.host.quant.QuantOptions
    march: str = "bayes-e"
    force_cpu: Sequence[str] = ()
    force_bpu: Sequence[str] = ()
    softmax_on_bpu: bool = False
    output_nodes: Sequence[str] = ()
    input_batch: int = 1
    layer_out_dump: bool = False
    optimize_level: str = "O3"
    remove_node_type: Sequence[str] = ()
    remove_node_name: Sequence[str] = ()
    max_calibration_samples: int = 0
    debug_dump_calibration: bool = False
    #: compiler_parameters.advice: log layers whose aligned computation exceeds theory by more (us); 0: off.
    advice: int = 0
    build_info: model_pb2.BuildInfo = field(default_factory=model_pb2.BuildInfo)
    #: The ONNX model in onnx_model when the caller has read it already (the run takes it over
    #: and reshapes it); None: the run reads onnx_model.
    float_model: Optional[onnx.ModelProto] = field(default=None, repr=False, compare=False)
    #: calibration_parameters.quant_config of the J6 flow as given: a JSON file's absolute path, or the
    #: inline mapping; None when not set (bpuemu.host.quant.quant_config reads it).
    quant_config: Union[None, str, dict] = None
    #: debug_mode dump_all_layers_output (J6): a dequantized output after each Conv and MatMul.
    dump_all_layers_output: bool = False

    @property
    def march_spec(self) -> March:
        """The description of ``march`` (bpuemu.common.march): what the flow does differently."""
        return march_of(self.march)


@dataclass
class Artifacts:
    original: str
    optimized: str
    calibrated: str
    quantized: str
    bin: str
    sha256: str
    cosines: Dict[str, float]
    table: str
    output_cosines: Dict[str, float] = field(default_factory=dict)
    #: Integer outputs (ArgMax indices, labels): fraction of elements equal to the float model's.
    output_agreements: Dict[str, float] = field(default_factory=dict)
    #: Stage -> (wall s, CPU s) of this run (bpuemu.host.quant.stages.STAGES, in that order).
    stages: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    #: Per node, in graph order (bpuemu.host.compiler.placement.NodePlacement): ON, subgraph, and on a
    #: J6 march or with a quant_config the resolved output_dtype, qtype_note and cosine_note.
    nodes: List = field(default_factory=list)
    #: Node -> the calibration threshold of its quantized input (the table's "Threshold" column).
    thresholds: Dict[str, float] = field(default_factory=dict)
    #: J6 only ("" on the X5): the fixed-point model, the one with removed nodes, the node table.
    bc: str = ""
    removed_bc: str = ""
    node_info: str = ""
    #: The node table, one dict per node: Node, ON, Subgraph, Type and the columns of bpuemu.host.convert.nodetable.
    node_rows: List[Dict[str, str]] = field(default_factory=list)


def artifact_paths(job: ConvertJob, directory: str = "") -> Dict[str, str]:
    """The artifacts' paths in ``directory`` (default: the job's working_dir), named by the march's flow:
    "quantized" is the QDQ model, "bin" the deployable model (.bin or .hbm); a J6 march adds "bc",
    "removed_bc" and "node_info"."""
    base = os.path.join(directory or job.working_dir, job.output_model_file_prefix)
    flow = job.march_spec.flow
    paths = {
        "original": base + "_original_float_model.onnx",
        "optimized": base + "_optimized_float_model.onnx",
        "calibrated": base + "_calibrated_model.onnx",
        "quantized": base + (flow.ptq_artifact or flow.quantized_artifact),
        "bin": base + flow.model_suffix,
    }
    if flow.ptq_artifact:
        paths["bc"] = base + flow.quantized_artifact
        paths["removed_bc"] = base + flow.removed_artifact
        paths["node_info"] = base + flow.node_info_artifact
    return paths


def float_model(job: "ConvertJob") -> onnx.ModelProto:
    """The float model with the job's input shapes, cut at output_nodes.

    A Caffe model is converted to ONNX here (the model-analysis stage), so the
    rest of the pipeline sees ONNX either way.
    """
    if not job.prototxt:
        model = job.float_model if job.float_model is not None else load_onnx(job.onnx_model, "onnx_model")
        return load_float_model(model, job.inputs, job.output_nodes, source=job.onnx_model)
    from bpuemu.host.caffe import caffe_to_onnx

    log.info("converting Caffe model %s (%s) to ONNX", job.caffe_model, job.prototxt)
    shapes = {ji.pre.name: tuple(ji.shape) for ji in job.inputs}
    converted = caffe_to_onnx(job.prototxt, job.caffe_model, shapes, job.output_nodes)
    return load_float_model(converted, job.inputs)


def load_float_model(model: onnx.ModelProto, inputs: Sequence[JobInput], output_nodes: Sequence[str] = (),
                     source: str = "") -> onnx.ModelProto:
    """``model`` (read from ``source``, named in errors) with the job's input shapes, cut at
    ``output_nodes``, shapes inferred again."""
    path = source or model.graph.name or "the model"
    by_name = {i.name: i for i in model.graph.input}
    real = [i.name for i in graph_inputs(model)]
    for ji in inputs:
        vi = by_name.get(ji.pre.name)
        if vi is None:
            raise InvalidInput(f"input_name '{ji.pre.name}' is not an input of {os.path.basename(path)}; its inputs: {', '.join(real)}")
        dims = vi.type.tensor_type.shape.dim
        model_shape = [d.dim_value if d.dim_value > 0 else None for d in dims]
        if len(model_shape) != len(ji.shape):
            raise InvalidInput(f"input_shape {'x'.join(map(str, ji.shape))} of '{ji.pre.name}' has {len(ji.shape)} dims, "
                               f"the model input has {len(model_shape)}")
        for d, want, have in zip(dims, ji.shape, model_shape):
            if have is not None and have != want:
                raise InvalidInput(f"input_shape {'x'.join(map(str, ji.shape))} of '{ji.pre.name}' does not match the model's "
                                   f"{'x'.join(str(s) if s else '?' for s in model_shape)}")
            d.ClearField("dim_param")
            d.dim_value = want
    missing = [n for n in real if n not in {ji.pre.name for ji in inputs}]
    if missing:
        raise InvalidInput(f"the model has inputs {missing} that input_parameters does not configure")
    if output_nodes:
        model = _cut_at(model, output_nodes)
    # Re-infer shapes after fixing the input dims (intermediate value_info may be stale).
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def _cut_at(model: onnx.ModelProto, output_nodes: Sequence[str]) -> onnx.ModelProto:
    from onnx import utils

    by_node = {n.name: n for n in model.graph.node}
    outs = []
    for name in output_nodes:
        if name in by_node:
            outs.extend(by_node[name].output)
        else:
            raise InvalidInput(f"output_nodes names '{name}', which is not a node of the model")
    inputs = [i.name for i in graph_inputs(model)]
    inferred = onnx.shape_inference.infer_shapes(model)
    return utils.Extractor(inferred).extract_model(inputs, outs)


def input_spec(ji: JobInput, featuremap_dtype: str = "float32") -> model_pb2.InputSpec:
    """The `.bin` input spec of ``ji``; ``featuremap_dtype``: a featuremap input's type in the model."""
    p = ji.pre
    if p.is_image:
        n, a, b, c = ji.shape
        nhwc = (n, b, c, a) if p.input_layout_train == "NCHW" else (n, a, b, c)
        shape = nhwc if p.model_layout == "NHWC" else (nhwc[0], nhwc[3], nhwc[1], nhwc[2])
        dtype = "int8"
    else:
        shape, dtype = ji.shape, featuremap_dtype
    return model_pb2.InputSpec(
        name=p.name, input_type_rt=p.input_type_rt,
        input_layout_rt="" if p.input_type_rt in ("nv12", "featuremap") else (ji.input_layout_rt or p.input_layout_train),
        input_space_and_range=p.input_space_and_range, model_layout=p.model_layout if len(shape) == 4 else "",
        model_dtype=dtype, model_shape=list(shape), plan_tensor=p.name,
    )


def _save(model: onnx.ModelProto, path: str) -> None:
    with atomic_output(path) as f:
        f.write(model.SerializeToString())


def _compact(feed: np.ndarray) -> np.ndarray:
    """An image input's feed (X_128 values, float32 from ``to_model_inputs``) held as int8: a quarter
    of the memory (490 MB -> 123 MB for 100 samples at 1x3x640x640), the same values for every
    session (``feed_for`` casts it to each model's input type, exactly). Kept as it is when a value
    is not an int8 (never, for an image input)."""
    if feed.dtype != np.float32:
        return feed
    small = feed.astype(np.int8)
    return small if np.array_equal(small, feed) else feed


def calibration_feeds(job: ConvertJob, specs, dump_dir: str = "") -> List[Dict[str, np.ndarray]]:
    """The model-input feeds of the calibration samples (image inputs held as int8, ``_compact``); with
    debug_dump_calibration, also saved in dump_dir (as float32, what the float model takes)."""
    cal = [ji.cal for ji in job.inputs]
    if any(c is None for c in cal):
        return []
    trains = {ji.pre.name: (ji.pre.input_type_train, ji.pre.input_layout_train) for ji in job.inputs}
    images = {spec.plan_tensor for spec in specs if spec.input_type_rt != "featuremap"}   # int8 values (X_128)
    feeds = []
    total = min(len(os.listdir(cal[0].cal_data_dir)), job.max_calibration_samples or 1 << 30)
    step = max(1, total // 10)
    for i, sample in enumerate(iter_samples(cal, job.max_calibration_samples)):
        if (i + 1) % step == 0 or i + 1 == total:
            log.info("calibration data: %d/%d sample(s) read", i + 1, total)
        feed = to_model_inputs(sample, specs, trains)
        if job.debug_dump_calibration:
            for name, arr in feed.items():
                d = os.path.join(dump_dir or job.working_dir, "calibration_data", name)
                os.makedirs(d, exist_ok=True)
                np.save(os.path.join(d, f"{i}.npy"), arr)
        feeds.append({name: _compact(arr) if name in images else arr for name, arr in feed.items()})
    log.info("read %d calibration sample(s)", len(feeds))
    return feeds


def run(job: ConvertJob) -> Artifacts:
    t_start, cpu_start = time.perf_counter(), time.process_time()
    log.info("Start Model Convert....")
    final = artifact_paths(job)
    clock = StageClock()
    j6 = job.march_spec.is_j6
    with Staging(job.working_dir, "hb_compile" if j6 else "makertbin", log) as stage:
        done = _convert(job, stage.dir, clock)
        checkpoint("makertbin:converted")
        stage.publish()
    saved = [("original", "original float model"), ("optimized", "optimized float model"),
             ("calibrated", "calibrated model"), ("quantized", "ptq model" if j6 else "quantized model")]
    if j6:
        saved += [("bc", "quantized model")] + ([("removed_bc", "quantized removed model")] if done.removed else [])
        saved += [("node_info", "node info"), ("bin", "hbm model")]
    else:
        saved += [("bin", "runtime model")]
    for key, what in saved:
        log.info("%s saved: %s", what, final[key])
    log.info("Convert to runtime %s file successfully!", "hbm" if j6 else "bin")
    total = (time.perf_counter() - t_start, time.process_time() - cpu_start)
    stages = clock.times(total)
    log.info("time by stage: %s", stages_line(stages))
    log.info("End Model Convert (%.1f s)", total[0])
    extra = {}
    if j6:
        extra = dict(bc=final["bc"], removed_bc=final["removed_bc"] if done.removed else "",
                     node_info=final["node_info"], node_rows=done.rows)
    return Artifacts(final["original"], final["optimized"], final["calibrated"], final["quantized"], final["bin"],
                     done.sha, done.sim.nodes, done.table, done.sim.outputs, done.sim.agreements, stages,
                     done.placement.nodes, done.thresholds, **extra)


@dataclass
class _Converted:
    """What ``_convert`` hands back to ``run``: the deployable model's SHA-256, the similarity and
    node table, the placement (its nodes carry the J6 precision notes) and the removed nodes."""

    sha: str
    sim: object
    table: str
    rows: List[Dict[str, str]]
    placement: object
    thresholds: Dict[str, float]
    removed: List[str]


def _convert(job: ConvertJob, out_dir: str, clock: StageClock) -> _Converted:
    """Every stage of the conversion, writing into ``out_dir`` (the staging directory)."""
    from bpuemu.host.quant.quant_config import parse_quant_config

    arch = job.march_spec
    qconfig = parse_quant_config(job.quant_config, arch)   # a bad quant_config fails before any work
    paths = artifact_paths(job, out_dir)
    original = insert_preprocess(float_model(job), [ji.pre for ji in job.inputs])
    if qconfig is not None:
        original = _apply_quant_config_to_model(original, qconfig)
    _save(original, paths["original"])

    optimized = optimize(original)
    _save(optimized, paths["optimized"])

    image_inputs = [ji.pre.name for ji in job.inputs if ji.pre.is_image]
    resolved = _resolve_quant_config(qconfig, optimized)
    placement = _place(optimized, job, image_inputs, arch, resolved)
    for line in placement.cpu_reasons():
        log.info(line)

    specs = [input_spec(ji, _input_dtype(optimized, ji.pre.name)) for ji in job.inputs]
    feeds, params, quantized = _quantize(job, optimized, placement, image_inputs, specs, paths, out_dir, clock,
                                         qconfig, resolved)
    if arch.is_j6 or qconfig is not None:
        from bpuemu.host.quant.precision import resolve_precision

        resolve_precision(placement, params.plan, resolved, arch.name, log)
    eval_feeds = feeds[: min(len(feeds), 16)]
    explain = _nan_explainer(placement, params, original) if arch.is_j6 else None
    with clock.stage("cosine table"):
        sim, table, rows = _report_accuracy(optimized, quantized, placement, params, eval_feeds, arch, explain)
    thresholds = getattr(params, "node_thresholds", lambda: {})()

    checkpoint("makertbin:compiling")
    with clock.stage("emit/compile"):
        if arch.is_j6:
            from bpuemu.host.convert.j6_artifacts import write_j6_artifacts

            specs = sorted(specs, key=lambda s: s.name)  # the .hbm's input order (j6_artifacts)
            model, blobs, removed = _compile(job, quantized, placement, specs, keep_full=True)
            _log_estimate(job, model, blobs)
            sha = write_j6_artifacts(job, paths, quantized, placement, rows, model, blobs, removed)
            return _Converted(sha, sim, table, rows, placement, thresholds, removed)
        model, blobs = _compile(job, quantized, placement, specs)
        _log_estimate(job, model, blobs)
        sha = write_bin(paths["bin"], [model], blobs)
    return _Converted(sha, sim, table, rows, placement, thresholds, [])


def _nan_explainer(placement, params, original: onnx.ModelProto):
    """What the J6 flow does to the node cosines: a node whose Calibrated Cosine is nan, or whose input
    is all zeros (a threshold of 0), shows nan with the reason in its cosine_note and the log
    (bpuemu.host.quant.nan_cosine); the conversion goes on."""
    from bpuemu.host.quant.nan_cosine import nan_cosine_notes

    def explain(cosines: Dict[str, float]) -> None:
        placed = placement.by_name()
        for name, note in nan_cosine_notes(placement, params, original, cosines).items():
            placed[name].cosine_note = note
            cosines[name] = float("nan")
            log.warning("Calibrated Cosine of node %s (%s) is nan: %s", name, placed[name].op_type, note)
    return explain


def _input_dtype(model: onnx.ModelProto, name: str) -> str:
    """The element type of input ``name`` of ``model`` ("float32" unless the model says otherwise: an int32
    featuremap runs as int32, ptq_faq_j6 int32 case 2)."""
    vi = next((i for i in model.graph.input if i.name == name), None)
    return elem_type_name(vi.type.tensor_type.elem_type) if vi is not None else "float32"


def _apply_quant_config_to_model(original: onnx.ModelProto, qconfig) -> onnx.ModelProto:
    """The quant_config's node names checked against the float model (named as the tables name them),
    and the unitconvs its node_config asks for inserted (bpuemu.host.convert.unitconv)."""
    from bpuemu.host.convert.unitconv import insert_unitconvs

    name_nodes(original)
    qconfig.check_names({n.name: n.op_type for n in original.graph.node if n.op_type != "Constant"}, log)
    where = qconfig.unitconvs()
    if where:
        original = insert_unitconvs(original, where)
        for node, side in where.items():
            log.info("unitconv %s_unitconv inserted %s node %s (quant_config node_config unitconv)", node, side, node)
    return original


def _resolve_quant_config(qconfig, optimized: onnx.ModelProto):
    """Node -> its resolved quant_config (empty without one); node_config names the optimizer fused away
    are logged, since their configuration no longer applies."""
    from bpuemu.host.quant.quant_config import configured_nodes

    if qconfig is None:
        return {}
    nodes = [(n.name, n.op_type) for n in optimized.graph.node if n.op_type != "Constant"]
    present = {n for n, _ in nodes}
    for name in qconfig.nodes:
        if name not in present:
            log.warning("%s: node %s was removed by the optimizer (folded or fused into another node); its "
                        "node_config does not apply", qconfig.source, name)
    return configured_nodes(qconfig, nodes)


def _quantize(job: ConvertJob, optimized: onnx.ModelProto, placement, image_inputs: Sequence[str], specs,
              paths: Dict[str, str], out_dir: str, clock: StageClock, qconfig=None, resolved=None):
    """Calibration on the job's data, then the calibrated and quantized models (both saved).
    Returns (calibration feeds, quantization parameters, quantized model)."""
    from bpuemu.host import quant
    from bpuemu.host.quant.quant_config import quant_options

    options = job.quant_options or quant.QuantOptions()
    if qconfig is not None or placement.high_precision_nodes:
        outputs = {n.name: tuple(n.output) for n in optimized.graph.node}
        options = quant_options(qconfig, options, resolved or {}, placement, outputs)
    feeds = calibration_feeds(job, specs, out_dir) if options.calibration_type not in ("skip", "load") else []
    if options.calibration_type not in ("skip", "load") and not feeds:
        raise InvalidInput("no calibration data: set cal_data_dir for every input, or calibration_type: skip")
    params = quant.calibrate(optimized, feeds, placement.bpu_nodes, image_inputs, options, log=log, clock=clock)
    with clock.stage("emit/compile"):
        calibrated = quant.build_calibrated_model(optimized, params)
        _save(calibrated, paths["calibrated"])
        quantized = quant.build_quantized_model(optimized, params, image_inputs)
        _check_loads(quantized, paths["quantized"])
        _save(quantized, paths["quantized"])
    checkpoint("makertbin:calibrated")
    return feeds, params, quantized


def _report_accuracy(optimized: onnx.ModelProto, quantized: onnx.ModelProto, placement, params, eval_feeds,
                     march: Optional[March] = None, explain=None):
    """The node table (bpuemu.host.convert.nodetable) with each node's cosine similarity and threshold,
    the per-output lines and the Concat check, all logged; ``explain(cosines)`` may mark cosines nan
    first (the J6 flow). Returns (the similarity, the table, its rows)."""
    from bpuemu.host import quant
    from bpuemu.host.convert.nodetable import node_columns, node_rows

    sim = quant.similarity(optimized, quantized, eval_feeds)  # node and output cosines from one run
    if explain is not None:
        explain(sim.nodes)
    cosines = sim.nodes
    thresholds = getattr(params, "node_thresholds", lambda: {})()
    columns = node_columns(placement, quantized, cosines, thresholds, march or march_of())
    table = placement.table(columns)
    rows = node_rows(placement, columns, march or march_of())
    for line in table.splitlines():
        log.info(line)
    if sim.fused and cosines:
        log.info("Cosine Similarity of a node fused with the Relu/Clip after it (%s) is taken at that activation's "
                 "output, the value the BPU computes for the pair", ", ".join(sorted(sim.fused)[:3]) + (
                     ", ..." if len(sim.fused) > 3 else ""))
    _report_outputs(sim, len(eval_feeds))
    _report_joins(optimized, quantized, eval_feeds)
    return sim, table, rows


def _compile(job: ConvertJob, quantized: onnx.ModelProto, placement, specs, keep_full: bool = False):
    """The `.bin` model entry and blobs: compiled (bpuemu.host.compiler.compile), then the nodes
    remove_node_type / remove_node_name name removed. With ``keep_full``, also the removed nodes' names."""
    from bpuemu.host.compiler.compile import compile_for_board

    model, blobs, _ = compile_for_board(
        quantized, job.output_model_file_prefix, specs, working_dir=job.working_dir,
        force_cpu=placement.cpu_nodes, force_bpu=placement.bpu_nodes, build_info=job.build_info, march=job.march,
        high_precision=placement.high_precision_nodes,
        input_batch=job.input_batch, layer_out_dump=job.layer_out_dump, optimize_level=job.optimize_level,
        input_sources={ji.pre.name: ji.input_source for ji in job.inputs if ji.input_source},
        dump_all_layers_output=job.dump_all_layers_output)
    names = []
    if job.remove_node_type or job.remove_node_name:
        from bpuemu.host.compiler.modifier import modify

        model, blobs, removed = modify(model, blobs, job.remove_node_name, job.remove_node_type)
        for r in removed:
            names.append(getattr(r, "name", str(r)))
            log.info("removed node %s (remove_node_type/remove_node_name)", names[-1])
        if job.march_spec.is_j6:
            _log_types_not_removed(job, placement, {getattr(r, "op_type", "") for r in removed})
    return (model, blobs, names) if keep_full else (model, blobs)


def _log_types_not_removed(job: ConvertJob, placement, removed_types) -> None:
    """One line per remove_node_type that has nothing to remove, rather than silence. A Dequantize behind the
    tail Conv: ptq_faq_j6's tail Conv outputs int32 (nash-e/m) or float32 (nash-b/h/p) unquantized, so there is
    no Dequantize to remove after it; the .hbm is built without removing anything there."""
    m = job.march_spec
    tails = sorted(placement.high_precision_nodes)
    for t in job.remove_node_type:
        if t == "Dequantize" and tails:
            log.info("remove_node_type Dequantize: the tail Conv %s outputs %s unquantized on %s (ptq_faq_j6), so "
                     "no Dequantize follows it: nothing to remove there, its output leaves the .hbm as it is",
                     ", ".join(tails), m.tail_output_dtype, m.name)
        elif t not in removed_types:
            log.info("remove_node_type %s: the model has no removable %s node", t, t)


def _log_estimate(job: ConvertJob, model: model_pb2.Model, blobs: Dict[str, bytes]) -> None:
    """The X5 timing model's estimate: stored in the `.bin`'s plan, logged (with compiler_parameters.advice);
    on a J6 march the logged figures are the march's (bpuemu.common.x5_timing.march_estimate_line)."""
    try:
        from bpuemu.host.compiler.timing.estimate import annotate

        est = annotate(model, blobs)  # the compile step storing each step's modeled X5 time in the .bin
        log.info("static performance estimate, %s:", est.strategy.describe())
        if job.march_spec.is_j6:  # the X5 model scaled per March.timing, as the board prints it, with its label
            from bpuemu.common.x5_timing import march_estimate_line

            log.info(march_estimate_line(model))
        else:
            log.info(est.line())
        if job.advice:
            from bpuemu.host.compiler.timing.estimate import advice_lines

            for line in advice_lines(est, job.advice):
                log.info(line)
    except BpuEmuError as exc:
        log.warning("no static performance estimate: %s", exc)


#: Below these, makertbin warns that the quantized model's outputs lose accuracy.
MIN_OUTPUT_COSINE = 0.99
MIN_OUTPUT_AGREEMENT = 0.9
_REMEDIES = "try calibration_type / per_channel, node_info int16, or run_on_cpu on the tail"


def _report_outputs(sim, samples: int) -> None:
    """One line per model output: the cosine for float outputs, the agreement rate for integer
    ones (ArgMax indices: a cosine of indices means nothing); a WARNING below the threshold."""
    for name, c in sim.outputs.items():
        log.info("output %s: cosine similarity %.6f (over %d calibration sample(s))", name, c, samples)
        if c < MIN_OUTPUT_COSINE:
            log.warning("output %s has cosine similarity %.4f < %g: expect an accuracy loss (%s)",
                        name, c, MIN_OUTPUT_COSINE, _REMEDIES)
    for name, a in sim.agreements.items():
        log.info("output %s: agreement rate %.6f (integer output: fraction of elements equal to the float "
                 "model's, over %d calibration sample(s))", name, a, samples)
        if a < MIN_OUTPUT_AGREEMENT:
            log.warning("output %s agrees with the float model on %.1f%% of its elements (< %g%%): expect an "
                        "accuracy loss (%s)", name, 100 * a, 100 * MIN_OUTPUT_AGREEMENT, _REMEDIES)


def _report_joins(optimized: onnx.ModelProto, quantized: onnx.ModelProto, feeds) -> None:
    """Outputs fed by a Concat, part by part: one cosine over a whole output can hide a
    collapsed part (bpuemu.host.quant.joins); one WARNING per join of mismatched ranges."""
    from bpuemu.host.quant.graph import prepare_model
    from bpuemu.host.quant.joins import check_joins

    if has_qdq(optimized):
        return  # a QAT model: its ranges are its own
    for finding in check_joins(prepare_model(optimized), quantized, feeds):
        for line in finding.report_lines():
            log.info(line)
        if finding.collapsed:
            log.warning(finding.warning())


def _place(optimized: onnx.ModelProto, job: ConvertJob, image_inputs: Sequence[str], arch=None, resolved=None):
    """BPU/CPU placement of the optimized model.

    A QDQ model (QAT export, calibration_type load) is placed on its float
    graph, the QuantizeLinear/DequantizeLinear pairs stripped (``strip_qdq``):
    on the QDQ graph every Relu or pooling op would sit between CPU-side Q/DQ
    nodes and fall to the CPU. Nodes the QAT model keeps in the integer domain
    (``qdq_wrapped_nodes``) go to the BPU when they meet its constraints, as the
    QAT model says; run_on_cpu still wins. Node names are those calibrate()
    gives the same model (unnamed nodes named before stripping).
    """
    from bpuemu.host.compiler.optable import check_constraints
    from bpuemu.host.compiler.placement import place
    from bpuemu.host.quant import qdq_wrapped_nodes, strip_qdq

    force_bpu = set(job.force_bpu)
    model = optimized
    if has_qdq(optimized):
        name_nodes(optimized)
        model, _, _ = strip_qdq(optimized)
        by_name = {n.name: n for n in model.graph.node}
        wrapped = {n for n in qdq_wrapped_nodes(optimized) if n in by_name}
        fits = {n for n in wrapped if not check_constraints(by_name[n], model)}
        for n in sorted(wrapped - fits):
            log.info("%s is in the integer domain of the QAT model but violates a BPU constraint (%s); it runs on the CPU",
                     n, check_constraints(by_name[n], model))
        force_bpu |= fits - set(job.force_cpu)
        log.info("QAT model: %d node(s) in its integer domain go to the BPU", len(fits))
    from bpuemu.host.quant.quant_config import placement_qtypes

    return place(model, quantized_inputs=image_inputs, force_cpu=job.force_cpu, force_bpu=sorted(force_bpu),
                 softmax_on_bpu=job.softmax_on_bpu, march=arch, qtypes=placement_qtypes(resolved or {}))


def _check_loads(model: onnx.ModelProto, path: str) -> None:
    """The quantized model must load in stock onnxruntime before we call it a success."""
    import onnxruntime as ort

    try:
        open_session(model, board_options=False, what="the quantized model")  # stock onnxruntime: what users run it with
    except InvalidInput as exc:
        raise BpuEmuError(f"{exc.message} (onnxruntime {ort.__version__})",
                          hint="this is a bpuemu bug; please report it with the model") from None

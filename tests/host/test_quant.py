"""bpuemu.host.quant: calibration methods, the quantized/calibrated models, and the `.bin` they compile to.

Real onnxruntime everywhere; every comparison uses the runtime's session
options (QDQ fusion off), as DESIGN.md's numerical contract demands.
"""
import logging
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from bpuemu.board.runtime import Runtime
from bpuemu.common.container import write_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.host import quant
from bpuemu.host import samples as host_samples
from bpuemu.host.compiler.partition import compile_model
from bpuemu.host.compiler.placement import place
from bpuemu.host.quant.calibrators import _entropy, _smooth, kl_divergences, kl_prefix_sums
from bpuemu.host.onnxgraph import feed_for, open_session as session

try:  # tests/ imported as a package, or its directories put on sys.path by pytest
    from tests.host import quant_models as QM
except ImportError:  # pragma: no cover - depends on how pytest was pointed at the tree
    import quant_models as QM
from search_checks import assert_same_choice  # noqa: E402

LOGGER = "bpuemu.host.quant"
QO = quant.QuantOptions


# --- fixtures -------------------------------------------------------------------------------------

class Case:
    """A float model, its placement and data, and memoized calibrations."""

    def __init__(self, model, cal, held, int8_inputs=()):
        self.model = model
        self.cal = cal
        self.held = held
        self.int8_inputs = list(int8_inputs)
        self.bpu = place(model, quantized_inputs=int8_inputs).bpu_nodes
        self._memo = {}

    def quantize(self, **opts):
        key = tuple(sorted((k, str(v)) for k, v in opts.items()))
        if key not in self._memo:
            params = quant.calibrate(self.model, self.cal, self.bpu, self.int8_inputs, QO(**opts))
            self._memo[key] = (params, quant.build_quantized_model(self.model, params, self.int8_inputs))
        return self._memo[key]


@pytest.fixture(scope="module")
def zoo():
    m = QM.zoo_model()
    return Case(m, QM.featuremaps(m, 8, seed=1), QM.featuremaps(m, 6, seed=99))


@pytest.fixture(scope="module")
def two_input():
    m = QM.two_input_model()
    return Case(m, QM.featuremaps(m, 8, seed=1), QM.featuremaps(m, 4, seed=99))


@pytest.fixture(scope="module")
def deconv():
    m = QM.deconv_matmul_model()
    return Case(m, QM.featuremaps(m, 8, seed=1), QM.featuremaps(m, 4, seed=99))


@pytest.fixture(scope="module")
def se():
    m = QM.squeeze_excitation_model()
    return Case(m, QM.featuremaps(m, 8, seed=1), QM.featuremaps(m, 4, seed=99))


@pytest.fixture(scope="module")
def image():
    m = host_samples.sample_float_model(32, 32, image_input=True)
    return Case(m, QM.images(m, 8, seed=1), QM.images(m, 4, seed=99), int8_inputs=["data"])


def run(model, sample):
    sess = session(model)
    return sess.run(None, feed_for(sess, sample))


def consumers(model, tensor):
    return [n for n in model.graph.node if tensor in n.input]


def producer(model, tensor):
    return next((n for n in model.graph.node if tensor in n.output), None)


def inits(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# --- the quantized model's conventions ----------------------------------------------------------

def test_quantized_model_follows_the_qdq_conventions(zoo):
    params, q = zoo.quantize(calibration_type="max")
    onnx.checker.check_model(q)
    assert next(o.version for o in q.opset_import if o.domain == "") >= 13
    session(q)  # stock onnxruntime loads it
    consts = inits(q)
    for node in q.graph.node:
        if node.name not in zoo.bpu:
            continue
        for i in node.input:
            if i and i not in consts:
                assert producer(q, i).op_type == "DequantizeLinear", (node.name, i)
        for o in node.output:
            assert {c.op_type for c in consumers(q, o)} == {"QuantizeLinear"}, (node.name, o)
    # Weights: int8, symmetric, per-channel along the op's output-channel axis.
    by_name = {n.name: n for n in q.graph.node}
    for conv, axis in [("Conv_stem", 0), ("Conv_dw", 0), ("Gemm_fc", 0)]:
        dq = producer(q, by_name[conv].input[1])
        assert dq.op_type == "DequantizeLinear" and next(a.i for a in dq.attribute if a.name == "axis") == axis
        w, scale, zp = (consts[i] for i in dq.input)
        assert w.dtype == np.int8 and zp.dtype == np.int8 and not zp.any()
        assert scale.shape == (w.shape[axis],)
        assert np.abs(w).max() == 127
    # Bias: int32 with scale s_x * s_w.
    conv = by_name["Conv_pw"]
    b_dq, w_dq, x_dq = producer(q, conv.input[2]), producer(q, conv.input[1]), producer(q, conv.input[0])
    assert consts[b_dq.input[0]].dtype == np.int32
    np.testing.assert_allclose(consts[b_dq.input[1]], consts[x_dq.input[1]] * consts[w_dq.input[1]], rtol=1e-6)
    # Model outputs made by the BPU end with Q -> DQ, names unchanged.
    for out in ("logits", "head"):
        dq = producer(q, out)
        assert dq.op_type == "DequantizeLinear" and producer(q, dq.input[0]).op_type == "QuantizeLinear"
    # The featuremap input stays float32 and is quantized by a QuantizeLinear.
    assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert [n.op_type for n in consumers(q, "x")] == ["QuantizeLinear"]


def test_weight_axes_of_convtranspose_matmul_and_gemm(deconv):
    params, q = deconv.quantize(calibration_type="max")
    assert {w: params.weights[w].axis for w in params.weights} == {
        "Conv_in_w": 0, "deconv_w": 1, "mm_w": 1, "fc_w": 1}
    assert params.weights["deconv_w"].scale.shape == (2,)
    # Grouped ConvTranspose: output channel c uses weight scale c % 2.
    by_name = {n.name: n for n in q.graph.node}
    consts = inits(q)
    b_scale = consts[producer(q, by_name["ConvTranspose_up"].input[2]).input[1]]
    s_x = params.activations["Conv_in_relu_out"].scale
    np.testing.assert_allclose(b_scale, s_x * np.tile(params.weights["deconv_w"].scale, 2), rtol=1e-6)
    assert set(deconv.bpu) >= {"ConvTranspose_up", "MatMul_w", "Gemm_fc"}


def test_passive_ops_share_their_input_scale_and_relu_sets_the_conv_range(zoo):
    params, _ = zoo.quantize(calibration_type="max")
    acts = params.activations
    for a, b in [("Relu_res_out", "MaxPool_0_out"), ("AveragePool_0_out", "Concat_0_out"),
                 ("Sigmoid_gate_out", "Resize_up_out"), ("GlobalAveragePool_0_out", "Flatten_0_out")]:
        assert acts[a].scale == acts[b].scale, (a, b)
    # Conv -> Relu: the Conv output takes the Relu output's (non-negative) range.
    assert acts["Conv_stem_out"].scale == acts["Conv_stem_relu_out"].scale
    assert params.plan.group_of("Conv_stem_out").sources == ["Conv_stem_relu_out"]
    # Conv_pw also feeds the residual Add: it keeps its own range.
    assert acts["Conv_pw_out"].scale != acts["Add_res_out"].scale


@pytest.mark.parametrize("method", ["max", "kl", "default"])
def test_output_cosine_on_held_out_data(zoo, method):
    params, q = zoo.quantize(calibration_type=method)
    cos = quant.output_cosines(zoo.model, q, zoo.held)
    assert set(cos) == {"logits", "head"}
    assert min(cos.values()) >= 0.99, cos


@pytest.mark.parametrize("case", ["two_input", "image", "deconv"])
def test_output_cosine_of_other_models(case, request):
    c = request.getfixturevalue(case)
    _, q = c.quantize(calibration_type="default")
    assert min(quant.output_cosines(c.model, q, c.held).values()) >= 0.99


# --- compile and run on the emulated BPU: bit-exact ---------------------------------------------

def _runtime_outputs(tmp_path, q, name, specs, feeds):
    compiled = compile_model(q, name, specs)
    path = os.path.join(tmp_path, f"{name}.bin")
    write_bin(path, [compiled.model], compiled.blobs)
    rt = Runtime()
    rt.load([path])
    return compiled, [rt.model().run(f) for f in feeds]


@pytest.mark.parametrize("case,opts", [
    ("zoo", dict(calibration_type="default")),
    ("zoo", dict(calibration_type="max", per_channel=True, asymmetric=True)),
    ("zoo", dict(calibration_type="kl", int16_kinds={"Conv": quant.Int16Spec(output=True)}, model_output_type="int8")),
    ("two_input", dict(calibration_type="max")),
    ("deconv", dict(calibration_type="default")),
    ("se", dict(calibration_type="max", per_channel=True)),
], ids=["zoo-default", "zoo-perchannel-asym", "zoo-int16-int8out", "two-input", "deconv-matmul", "se-perchannel-requantize"])
def test_runtime_reproduces_the_quantized_model_bit_exactly(case, opts, request, tmp_path):
    c = request.getfixturevalue(case)
    _, q = c.quantize(**opts)
    sess = session(q)
    feeds = [feed_for(sess, s) for s in c.held[:2]]
    compiled, outs = _runtime_outputs(tmp_path, q, case, None, [[f[i.name] for i in q.graph.input] for f in feeds])
    assert [s.name for s in compiled.model.plan if s.name.startswith("BPU_")] == [f"BPU_{case}_subgraph_0"]
    for f, out in zip(feeds, outs):
        ref = sess.run(None, f)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ref, out))


def test_image_input_is_int8_and_runs_from_rgb_bytes(image, tmp_path):
    params, q = image.quantize(calibration_type="default")
    (inp,) = q.graph.input
    assert inp.name == "data" and inp.type.tensor_type.elem_type == TensorProto.INT8
    (dq,) = consumers(q, "data")
    assert dq.op_type == "DequantizeLinear"
    consts = inits(q)
    assert consts[dq.input[1]] == np.float32(1.0) and consts[dq.input[2]] == 0
    assert params.activations["data"].method == "fixed"
    assert params.node_thresholds()["HzPreprocess"] == 127.0
    # The Softmax tail runs on the CPU, in float, from the Gemm's dequantized output.
    softmax = next(n for n in q.graph.node if n.op_type == "Softmax")
    assert producer(q, softmax.input[0]).op_type == "DequantizeLinear"
    # Through the runtime: rgb bytes (NHWC) -> Preprocess (-128) -> the plan.
    spec = host_samples.image_input_spec(q, "rgb", "NHWC")
    x = [np.rint(s["data"]).astype(np.int16) for s in image.held[:2]]
    rgb = [np.ascontiguousarray((v + 128).astype(np.uint8).transpose(0, 2, 3, 1)) for v in x]
    _, outs = _runtime_outputs(tmp_path, q, "img", [spec], [[r] for r in rgb])
    sess = session(q)
    for v, out in zip(x, outs):
        assert np.array_equal(sess.run(None, {"data": v.astype(np.int8)})[0], out[0])


# --- calibration methods ----------------------------------------------------------------------------

def _heavy_tail(n=400_000, seed=0):
    return np.random.default_rng(seed).standard_t(2.5, n).astype(np.float32)


def test_kl_and_percentile_cut_a_heavy_tail():
    st = quant.TensorStats.of(_heavy_tail())
    mx = quant.max_threshold(st)
    assert mx == pytest.approx(float(np.abs(_heavy_tail()).max()))
    p5 = quant.max_threshold(st, 0.99995)
    p3 = quant.max_threshold(st, 0.999)
    kl = quant.kl_threshold(st)
    assert p3 < p5 < mx
    assert p5 == pytest.approx(np.quantile(np.abs(_heavy_tail()), 0.99995), rel=0.02)
    assert 0 < kl < mx / 2


def test_kl_divergences_match_the_straightforward_loop():
    """The prefix-sum KL equals onnxruntime's per-cut loop (P with outliers, merged Q, smoothing)."""
    hist, _ = np.histogram(np.abs(_heavy_tail(60_000, seed=3)), bins=384)
    qb = 96
    ref = []
    for i in range(qb, len(hist) + 1):
        sliced = hist[:i].astype(np.int64)
        p = sliced.copy()
        p[-1] += hist[i:].sum()
        nz = p != 0
        m = i // qb
        q = np.zeros(i, np.int64)
        for j in range(qb):
            s, e = j * m, (j + 1) * m if j < qb - 1 else i
            if nz[s:e].sum():
                q[s:e] = sliced[s:e].sum() // nz[s:e].sum()
        q[~nz] = 0
        ps, qs = _smooth(p), _smooth(q)
        ref.append(np.inf if ps is None or qs is None else _entropy(ps, qs))
    ref = np.array(ref)
    fast = kl_divergences(hist, qb)
    finite = np.isfinite(ref)
    np.testing.assert_allclose(fast[finite], ref[finite], rtol=1e-6, atol=1e-9)
    assert np.argmin(fast) == np.argmin(ref)


def _running_totals(h):
    """The prefix sums the KL computation reads, as plain running totals (one bin after the other, each
    starting at 0): counts, non-empty bins, count x log count and log count, an empty bin adding 0."""
    logs = np.log(np.where(h > 0, h, 1).astype(np.float64))     # log 1 = 0 for an empty bin
    C, NZ, L1, L0 = [0], [0], [0.0], [0.0]
    for count, log in zip(h.tolist(), logs.tolist()):
        C.append(C[-1] + count)
        NZ.append(NZ[-1] + (count > 0))
        L1.append(L1[-1] + float(count) * log)
        L0.append(L0[-1] + log)
    return np.array(C, np.int64), np.array(NZ, np.int64), np.array(L1), np.array(L0)


def test_kl_prefix_sums_are_the_running_totals():
    rng = np.random.default_rng(7)
    h = rng.integers(0, 50, 300)
    h[rng.integers(0, 300, 100)] = 0
    for got, want in zip(kl_prefix_sums(h), _running_totals(h)):
        assert got.dtype.kind == want.dtype.kind and got.tobytes() == want.tobytes()


def _kl_gathered(hist, quantized_bins=128, eps=0.0001):
    """kl_divergences as it was before the per-m rows: every cut's groups gathered (the reference
    the computation shared per m must equal bit for bit), on prefix sums of its own."""
    h = np.asarray(hist, dtype=np.int64)
    n = h.size
    total = int(h.sum())
    C, NZ, L1, L0 = _running_totals(h)
    I = np.arange(quantized_bins, n + 1)
    m = I // quantized_bins
    j = np.arange(quantized_bins)
    starts = m[:, None] * j[None, :]
    ends = np.concatenate([starts[:, 1:], I[:, None]], axis=1)
    outliers = total - C[I]
    sums = C[ends] - C[starts]
    nnz = NZ[ends] - NZ[starts]
    last_raw = h[I - 1]
    last_p = last_raw + outliers
    nnz[:, -1] += ((last_raw == 0) & (last_p > 0)).astype(np.int64)
    per_bin = np.where(nnz > 0, sums // np.maximum(nnz, 1), 0)
    nnz_p = NZ[I - 1] + (last_p > 0)
    zeros_p = I - nnz_p
    with np.errstate(divide="ignore", invalid="ignore"):
        e_p = eps * zeros_p / nnz_p
        zeros_q = zeros_p + np.sum(np.where(per_bin == 0, nnz, 0), axis=1)
        nnz_q = I - zeros_q
        e_q = eps * zeros_q / np.maximum(nnz_q, 1)
        a = L1[I - 1] - e_p * (L0[I - 1] + NZ[I - 1])
        lp = last_p - e_p
        a = a + np.where(last_p > 0, lp * np.log(np.where(last_p > 0, lp, 1.0)), 0.0)
        group_p = sums.astype(np.float64)
        group_p[:, -1] += outliers
        qv = np.where(per_bin > 0, per_bin - e_q[:, None], eps)
        x = np.sum((group_p - e_p[:, None] * nnz) * np.log(qv), axis=1)
        sq = np.sum(per_bin * nnz, axis=1).astype(np.float64)
        kl = (a - x) / total + np.log(sq) - np.log(total)
    kl[(nnz_q <= 0) | (nnz_p <= 0) | ~np.isfinite(kl)] = np.inf
    return kl


@pytest.mark.parametrize("bins,qb", [(2048, 128), (1000, 128), (300, 255), (128, 128), (384, 96)])
def test_kl_divergences_shared_per_m_equal_every_cut_gathered_bit_for_bit(bins, qb):
    """The thresholds KL picks must not move: the divergences equal the gathered computation's
    exactly, on dense, sparse (empty runs) and spiky histograms, for bin counts not a multiple of qb."""
    rng = np.random.default_rng(bins + qb)
    for values in (np.abs(rng.standard_cauchy(100_000)), rng.exponential(1, 50_000), rng.uniform(0, 1, 60),
                   np.abs(rng.standard_t(2, 200_000))):
        hist, _ = np.histogram(values, bins=bins, range=(0, values.max()))
        for sparse in (False, True):
            h = hist.copy()
            if sparse:
                h[rng.integers(0, bins, bins // 3)] = 0
            h[0] = h[1]
            assert kl_divergences(h, qb).tobytes() == _kl_gathered(h, qb).tobytes()
    assert kl_divergences(np.ones(100, np.int64), 128).size == 0


def test_thresholds_through_calibrate_on_heavy_tailed_input():
    m = QM.identity_conv_model()
    rng = np.random.default_rng(5)
    cal = [{"x": rng.standard_t(2.5, (1, 4, 16, 16)).astype(np.float32)} for _ in range(12)]
    bpu = place(m).bpu_nodes
    t = {ct: quant.calibrate(m, cal, bpu, [], QO(**kw)).activations["x"].max_threshold
         for ct, kw in [("max", dict(calibration_type="max")), ("kl", dict(calibration_type="kl")),
                        ("pct", dict(calibration_type="max", max_percentile=0.999))]}
    assert t["max"] == pytest.approx(max(float(np.abs(c["x"]).max()) for c in cal), rel=1e-6)
    assert t["kl"] <= t["max"] and t["pct"] < t["max"]


def test_asymmetric_uses_the_whole_int8_range_after_relu():
    m = QM.relu_model()
    cal = QM.featuremaps(m, 8, seed=1)
    bpu = place(m).bpu_nodes
    sym = quant.calibrate(m, cal, bpu, [], QO(calibration_type="max"))
    asym = quant.calibrate(m, cal, bpu, [], QO(calibration_type="max", asymmetric=True))
    s, a = sym.activations["Conv_a_relu_out"], asym.activations["Conv_a_relu_out"]
    assert int(s.zero_point) == 0 and int(a.zero_point) == -128
    assert float(a.scale) == pytest.approx(float(s.scale) * 127 / 255, rel=1e-5)
    assert asym.asymmetric and asym.description == "max + asymmetric"
    # Finer steps on the Relu output: its node cosine improves.
    held = QM.featuremaps(m, 4, seed=7)
    cs = quant.node_cosines(m, quant.build_quantized_model(m, sym), held)
    ca = quant.node_cosines(m, quant.build_quantized_model(m, asym), held)
    assert ca["Conv_a_relu"] > cs["Conv_a_relu"]


def test_per_channel_featuremap_calibration(zoo):
    params, q = zoo.quantize(calibration_type="max", per_channel=True)
    pc = params.activations["Conv_stem_relu_out"]
    assert pc.axis == 1 and pc.scale.shape == (8,)
    # Channel thresholds never exceed the tensor's.
    per_tensor, _ = zoo.quantize(calibration_type="max")
    assert np.all(pc.threshold <= per_tensor.activations["Conv_stem_relu_out"].max_threshold + 1e-6)
    # A group changing the channel count (Concat) stays per-tensor.
    assert params.activations["Concat_0_out"].axis is None
    assert min(quant.output_cosines(zoo.model, q, zoo.held).values()) >= 0.99


@pytest.mark.parametrize("asymmetric", [False, True])
def test_per_channel_model_loads_in_stock_onnxruntime(zoo, asymmetric):
    """Stock onnxruntime fuses DQ -> AveragePool -> Q into QLinearAveragePool, which takes one scale: the
    tensors around an AveragePool stay per-tensor (PP-OCRv4 rec's default search once ended in a model
    onnxruntime refused), the others keep their channel scales."""
    params, q = zoo.quantize(calibration_type="max", per_channel=True, asymmetric=asymmetric)
    session(q, board_options=False)
    assert params.activations["AveragePool_0_out"].axis is None and params.activations["MaxPool_0_out"].axis is None
    assert params.activations["Conv_stem_relu_out"].axis == 1


def _dq_axis_and_scale(model, dq):
    return next((a.i for a in dq.attribute if a.name == "axis"), None), inits(model)[dq.input[1]]


@pytest.mark.parametrize("asymmetric", [False, True])
def test_per_channel_calibration_keeps_its_channels_around_a_pooling_head(se, tmp_path, asymmetric):
    """Per-channel featuremap calibration must not silently fall back to one scale where a tensor also
    feeds an op that takes one (GlobalAveragePool): the HardSwish output stays per channel for the Mul
    that scales it, and the pooling reads it through a requantize to one scale (DQ per channel -> Q per
    tensor), which stock onnxruntime loads and runs with its default options."""
    import onnxruntime as ort

    params, q = se.quantize(calibration_type="max", per_channel=True, asymmetric=asymmetric)
    for t in ("Conv_a_out", "HardSwish_a_out", "Mul_se_out"):
        assert params.activations[t].axis == 1, t
    assert params.activations["GlobalAveragePool_se_out"].axis is None
    by_name = {n.name: n for n in q.graph.node}
    # The Mul reads the HardSwish output per channel ...
    dq_mul = producer(q, by_name["Mul_se"].input[0])
    axis, scale = _dq_axis_and_scale(q, dq_mul)
    assert dq_mul.op_type == "DequantizeLinear" and axis == 1 and scale.shape == (8,) and len(set(scale.tolist())) > 1
    # ... the pooling reads it at one scale, requantized from that per-channel tensor.
    dq_gap = producer(q, by_name["GlobalAveragePool_se"].input[0])
    assert dq_gap.op_type == "DequantizeLinear" and _dq_axis_and_scale(q, dq_gap)[1].shape == ()
    requantize = producer(q, dq_gap.input[0])
    assert requantize.op_type == "QuantizeLinear" and requantize.input[0] == dq_mul.output[0]
    assert inits(q)[requantize.input[1]] == params.requantizations()["HardSwish_a_out"].scale
    path = os.path.join(tmp_path, "se_quantized_model.onnx")
    onnx.save(q, path)
    stock = ort.InferenceSession(path)  # stock onnxruntime, default options (QDQ fusion on: QLinear pooling)
    stock.run(None, se.held[0])           # QLinearGlobalAveragePool loads a per-channel scale, and refuses it here
    # The calibrated model says the same: a per-tensor calibration node after the per-channel one, read by the pooling.
    calibrated = quant.build_calibrated_model(se.model, params)
    c_by_name = {n.name: n for n in calibrated.graph.node}
    rq = c_by_name["HardSwish_a_out_Requantize_HzCalibration"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in rq.attribute}
    assert "axis" not in attrs and np.float32(attrs["scales"][0]) == params.requantizations()["HardSwish_a_out"].scale
    assert producer(calibrated, rq.input[0]).name == "HardSwish_a_out_HzCalibration"
    assert c_by_name["GlobalAveragePool_se"].input[0] == rq.output[0]


def test_a_tensor_only_pooled_is_calibrated_per_tensor_without_a_requantize(zoo, se):
    """Where every reader takes one scale (the zoo's MaxPool -> AveragePool), the producer writes that one
    scale itself: no per-channel tensor, no requantize (two roundings). Where another reader keeps the
    channels (the zoo's GlobalMaxPool beside its GlobalAveragePool), only the one-scale reader requantizes."""
    params, _ = se.quantize(calibration_type="max", per_channel=True)
    assert set(params.requantizations()) == {"HardSwish_a_out"}
    params, q = zoo.quantize(calibration_type="max", per_channel=True)
    assert params.activations["MaxPool_0_out"].axis is None and "MaxPool_0_out" not in params.requantizations()
    assert params.activations["Conv_down_relu_out"].axis == 1 and set(params.requantizations()) == {"Conv_down_relu_out"}
    assert params.plan.single_scale_reads["Conv_down_relu_out"] == [("GlobalAveragePool_0", 0)]
    assert not any(n.name.endswith("_Requantize_QuantizeLinear") and not n.name.startswith("Conv_down_relu_out")
                   for n in q.graph.node)
    gmp = next(n for n in q.graph.node if n.name == "GlobalMaxPool_0")
    assert _dq_axis_and_scale(q, producer(q, gmp.input[0]))[0] == 1


def test_default_search_logs_its_choice(zoo, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        params = quant.calibrate(zoo.model, zoo.cal, zoo.bpu, [], QO())
    names = [c.name for c in params.candidates]
    assert names[:3] == ["max", "max-percentile 0.99995", "kl"]
    best = max(params.candidates, key=lambda c: c.cosine)
    assert params.method == best.name.split(" + ")[0]
    assert f"Select {params.method} method." in caplog.messages
    if best.cosine >= 0.995:
        assert len(names) == 3


def test_default_search_scores_on_samples_held_out_of_the_statistics(zoo, caplog):
    """From search_held_out_from samples on, the candidates are scored on the last search_samples, which
    the statistics never see (the chosen thresholds are those of the other samples alone), and the log
    says which samples scored; with fewer, the first ones score and are calibrated on too."""
    cal = QM.featuremaps(zoo.model, 12, seed=5)
    opts = dict(search_samples=4, search_held_out_from=12, search_target=1.01)  # all five candidates
    with caplog.at_level(logging.INFO, logger=LOGGER):
        params = quant.calibrate(zoo.model, cal, zoo.bpu, [], QO(**opts))
    assert "default search: scoring candidates on calibration samples 9-12 of 12, held out of the calibration " \
           "statistics (calibrated on samples 1-8)" in caplog.messages
    assert max(c.samples for c in params.candidates) == 4
    chosen = dict(calibration_type="max", max_percentile=0.99995, per_channel=params.per_channel,
                  asymmetric=params.asymmetric) if params.method.startswith("max-percentile") else \
        dict(calibration_type=params.method, per_channel=params.per_channel, asymmetric=params.asymmetric)
    alone = quant.calibrate(zoo.model, cal[:8], zoo.bpu, [], QO(**chosen))
    every = quant.calibrate(zoo.model, cal, zoo.bpu, [], QO(**chosen))
    same = lambda a, b: all(np.array_equal(a.activations[t].scale, b.activations[t].scale) for t in a.activations)  # noqa: E731
    assert same(params, alone) and not same(params, every)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        quant.calibrate(zoo.model, cal[:11], zoo.bpu, [], QO(**opts))
    assert "default search: scoring candidates on calibration samples 1-4 of 11, which calibration also sees " \
           "(samples are held out from 12 on)" in caplog.messages


def test_default_search_steps_two_and_three(zoo, caplog):
    """With an unreachable target the search runs all five candidates and keeps the best."""
    with caplog.at_level(logging.INFO, logger=LOGGER):
        params = quant.calibrate(zoo.model, zoo.cal, zoo.bpu, [], QO(search_target=1.01))
    names = [c.name for c in params.candidates]
    assert names[:4] == ["max", "max-percentile 0.99995", "kl", "max-percentile 0.99995 + perchannel"]
    assert len(names) == 5 and names[4] == "max-percentile 0.99995 + perchannel + asymmetric"
    best = max(params.candidates, key=lambda c: c.cosine)
    assert params.description == best.name
    assert f"Select {params.method} method." in caplog.messages
    assert ("Perchannel quantization is enabled." in caplog.messages) == params.per_channel
    assert ("Asymmetric quantization is enabled." in caplog.messages) == params.asymmetric


def test_mix_search(zoo, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        params, q = zoo.quantize(calibration_type="mix")
    names = [c.name for c in params.candidates]
    assert names[:3] == ["kl", "max", "max-percentile 0.99995"] and names[-1] == "mix"
    assert any("quantization-sensitive node" in m for m in caplog.messages)
    assert any(m.startswith("Select ") for m in caplog.messages)
    assert min(quant.output_cosines(zoo.model, q, zoo.held).values()) >= 0.99


def test_skip_needs_no_data(zoo, caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        params = quant.calibrate(zoo.model, [], zoo.bpu, [], QO(calibration_type="skip"))
    assert params.method == "skip"
    assert any("cannot be used for accuracy" in m for m in caplog.messages)
    q = quant.build_quantized_model(zoo.model, params)
    session(q)
    compile_model(q, "skip")
    again = quant.calibrate(zoo.model, [], zoo.bpu, [], QO(calibration_type="skip"))
    assert all(np.array_equal(again.activations[t].scale, q_.scale) for t, q_ in params.activations.items())


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_load_round_trips_an_onnxruntime_qdq_model(zoo, symmetric):
    ort_q = QM.ort_quantize_static(zoo.model, zoo.cal, symmetric)
    float_model, loaded, _ = quant.strip_qdq(ort_q)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in float_model.graph.node)
    bpu = place(float_model).bpu_nodes
    params = quant.calibrate(ort_q, [], bpu, [], QO(calibration_type="load"))
    assert params.method == "load"
    for t, lq in loaded.items():
        if t in params.activations:
            assert np.array_equal(params.activations[t].scale, lq.scale)
    q = quant.build_quantized_model(ort_q, params)
    compile_model(q, "load")
    for s in zoo.held[:2]:
        assert all(np.array_equal(a, b) for a, b in zip(run(q, s), run(ort_q, s)))


def test_bias_correction(zoo):
    plain, _ = zoo.quantize(calibration_type="max")
    params, q = zoo.quantize(calibration_type="max", bias_correction=True)
    assert set(params.bias_corrections) >= {"Conv_stem", "Conv_pw", "Gemm_fc"}
    consts = inits(zoo.model)
    assert not np.allclose(params.bias_corrections["Conv_pw"], consts["Conv_pw_b"])
    # The int32 bias written is the corrected one.
    conv = next(n for n in q.graph.node if n.name == "Conv_pw")
    dq = producer(q, conv.input[2])
    qc = inits(q)
    scale = qc[dq.input[1]]
    assert np.all(np.abs(qc[dq.input[0]] * scale - params.bias_corrections["Conv_pw"]) <= scale * 0.5001)
    assert min(quant.output_cosines(zoo.model, q, zoo.held).values()) >= 0.99


# --- int16, output types ------------------------------------------------------------------------------

def test_int16_and_int8_model_output(zoo):
    params, q = zoo.quantize(calibration_type="kl", int16_kinds={"Conv": quant.Int16Spec(output=True)}, model_output_type="int8")
    assert next(o.version for o in q.opset_import if o.domain == "") == 21
    assert params.activations["Conv_pw_out"].dtype == "int16"
    assert params.activations["Conv_stem_relu_out"].dtype == "int16"  # the Relu shares the Conv's group
    assert params.activations["AveragePool_0_out"].dtype == "int8"
    qn = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "Conv_pw_out")
    assert inits(q)[qn.input[2]].dtype == np.int16
    out_types = {o.name: o.type.tensor_type.elem_type for o in q.graph.output}
    assert out_types == {"logits": TensorProto.INT8, "head": TensorProto.INT16}  # head is a Conv output: int16 wins
    assert producer(q, "logits").op_type == "QuantizeLinear"
    assert min(quant.output_cosines(zoo.model, q, zoo.held).values()) >= 0.99


def test_int16_falls_back_to_int8_where_unsupported(image, caplog):
    opts = QO(calibration_type="max", int16_nodes={"Softmax_prob": quant.Int16Spec(all_inputs=True, output=True)})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        params = quant.calibrate(image.model, image.cal, image.bpu, image.int8_inputs, opts)
    assert any("falls back" in m for m in caplog.messages)
    assert not params.int16_tensors()


def test_options_from_optimization():
    o = QO.from_optimization(["set_model_output_int16", "set_Conv_input_int16", "set_Sigmoid_output_int16",
                              "bias_correction", "set_Softmax_input_int8"], calibration_type="kl")
    assert o.model_output_type == "int16" and o.bias_correction
    assert o.int16_kinds == {"Conv": quant.Int16Spec(all_inputs=True), "Sigmoid": quant.Int16Spec(output=True)}
    with pytest.raises(InvalidInput):
        QO.from_optimization(["set_everything_fast"])


# --- calibrated model, cosines ------------------------------------------------------------------------

def test_calibrated_model_and_fake_quant(zoo):
    params, q = zoo.quantize(calibration_type="max")
    cal = quant.build_calibrated_model(zoo.model, params)
    nodes = quant.calibration_nodes(cal)
    assert len(nodes) == len(params.activations) + len(params.weights)
    assert all(n.domain == "horizon" and n.name.endswith("_HzCalibration") for n in nodes)
    assert {o.domain for o in cal.opset_import} >= {"", "horizon"}
    by_name = {n.name: n for n in nodes}
    a = {x.name: onnx.helper.get_attribute_value(x) for x in by_name["Conv_pw_out_HzCalibration"].attribute}
    assert a["kind"] == b"activation" and a["quant_type"] == b"int8" and a["method"] == b"max"
    assert a["scales"] == pytest.approx([float(params.activations["Conv_pw_out"].scale)])
    w = {x.name: onnx.helper.get_attribute_value(x) for x in by_name["Conv_pw_w_HzCalibration"].attribute}
    assert w["kind"] == b"weight" and w["axis"] == 0 and len(w["thresholds"]) == 8
    fq = quant.calibrated_to_fakequant(cal)
    assert not quant.calibration_nodes(fq)
    for s in zoo.held[:2]:
        for x, y in zip(run(fq, s), run(q, s)):
            assert quant.cosine(x, y) > 0.9999
    # All calibration nodes off: the float model.
    off = quant.calibrated_to_fakequant(cal, enabled=())
    for x, y in zip(run(off, zoo.held[0]), run(zoo.model, zoo.held[0])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_node_cosines(zoo):
    params, q = zoo.quantize(calibration_type="default")
    cos = quant.node_cosines(zoo.model, q, zoo.held)
    assert set(zoo.bpu) <= set(cos)
    assert cos["Gemm_fc"] >= 0.99 and cos["Conv_head"] >= 0.99
    assert all(0.9 < v <= 1.0 + 1e-9 for v in cos.values())
    thresholds = params.node_thresholds()
    assert set(thresholds) == set(zoo.bpu)


def test_a_conv_fused_with_its_relu_reports_the_cosine_at_the_relu_output():
    """The Conv's output takes the Relu's non-negative range, so its quantized values clip;
    compared with the float Conv output (negatives included) its cosine would be low though
    nothing the BPU computes is lost. Its row reports the Relu's output instead."""
    m = QM.negative_conv_relu_model()
    cal, held = QM.featuremaps(m, 8, seed=1), QM.featuremaps(m, 4, seed=9)
    params = quant.calibrate(m, cal, place(m).bpu_nodes, [], QO(calibration_type="max"))
    q = quant.build_quantized_model(m, params)
    assert quant.fused_activations(m, q) == {"Conv_a": "Conv_a_relu"}
    cos = quant.node_cosines(m, q, held)
    assert cos["Conv_a"] == cos["Conv_a_relu"] > 0.999
    # What the column used to show: the clipped Conv output against the float one.
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("Conv_a_out"))
    from bpuemu.host.onnxgraph import with_outputs

    fs, qs = session(with_outputs(m, ["Conv_a_out"])), session(with_outputs(q, [dq.output[0]]))
    raw = np.mean([quant.cosine(fs.run(["Conv_a_out"], feed_for(fs, s))[0], qs.run([dq.output[0]], feed_for(qs, s))[0])
                   for s in held])
    assert raw < 0.97, raw
    # A node with more than one reader (Conv_pw also feeds the residual Add) is not fused.
    zoo_m = QM.zoo_model()
    zp = quant.calibrate(zoo_m, QM.featuremaps(zoo_m, 4, seed=1), place(zoo_m).bpu_nodes, [], QO(calibration_type="max"))
    fused = quant.fused_activations(zoo_m, quant.build_quantized_model(zoo_m, zp))
    assert fused["Conv_stem"] == "Conv_stem_relu" and "Conv_pw" not in fused and "Conv_head" not in fused


def test_similarity_matches_a_direct_run_of_both_models(zoo):
    _, q = zoo.quantize(calibration_type="max")
    sim = quant.similarity(zoo.model, q, zoo.held)
    fs, qs = session(zoo.model), session(q)
    for k, name in enumerate(o.name for o in zoo.model.graph.output):
        want = np.mean([quant.cosine(fs.run(None, feed_for(fs, s))[k], qs.run([name], feed_for(qs, s))[0]) for s in zoo.held])
        # (the float model runs here with extra outputs: onnxruntime's float fusions may move the last digits)
        assert sim.outputs[name] == pytest.approx(want, abs=1e-7)
    assert sim.nodes == quant.node_cosines(zoo.model, q, zoo.held)
    assert quant.similarity(zoo.model, q, []).nodes == {}


def test_cosine_edge_cases_and_agreement_with_float64_dot():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 40, 40)).astype(np.float32)
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    assert quant.cosine(a, b) == pytest.approx(a64 @ b64 / np.sqrt((a64 @ a64) * (b64 @ b64)), abs=1e-12)
    assert quant.cosine(a, a) == pytest.approx(1.0, abs=1e-12) and quant.cosine(a, -a) == pytest.approx(-1.0, abs=1e-12)
    z = np.zeros(5, np.float32)
    assert quant.cosine(z, z) == 1.0 and quant.cosine(z, np.ones(5)) == 0.0


def test_max_calibration_collects_no_histograms(zoo):
    """Max needs only ranges: the second pass over the samples (the histograms) is skipped,
    with the same thresholds as from full statistics."""
    from bpuemu.host.quant.calibrators import ThresholdCache
    from bpuemu.host.quant.statistics import collect_statistics

    plan = zoo.quantize(calibration_type="max")[0].plan
    tensors = plan.stat_tensors()
    full = collect_statistics(plan.model, tensors, zoo.cal, plan.infos)
    ranges = collect_statistics(plan.model, tensors, zoo.cal, plan.infos, histograms=False, per_channel=False)
    assert set(full) == set(ranges)
    for t in tensors:
        assert ranges[t].hist is None and ranges[t].channel_min is None and full[t].hist is not None
        assert (ranges[t].min, ranges[t].max) == (full[t].min, full[t].max)
        assert quant.max_threshold(ranges[t]) == quant.max_threshold(full[t])
    cache = ThresholdCache(ranges)
    with pytest.raises(ValueError, match="histograms"):
        cache.threshold(tensors[0], quant.Method("kl"))


def test_sensitivity_of_nodes(zoo):
    params, _ = zoo.quantize(calibration_type="max")
    cal = quant.build_calibrated_model(zoo.model, params)
    sens = quant.sensitivity_of_nodes(cal, zoo.held[:2])
    assert set(sens) == set(zoo.bpu)
    values = list(sens.values())
    assert values == sorted(values) and all(v > 0.99 for v in values)
    weights = quant.sensitivity_of_nodes(cal, zoo.held[:2], node_type="weight")
    assert set(weights) == {f"{w}_HzCalibration" for w in params.weights}


# --- inputs the quantizer must cope with, and refusals ---------------------------------------------

def test_low_opset_model_is_converted():
    m = QM.opset11_model()
    cal = QM.featuremaps(m, 4, seed=1)
    params = quant.calibrate(m, cal, place(m).bpu_nodes, [], QO(calibration_type="max"))
    q = quant.build_quantized_model(m, params)
    assert next(o.version for o in q.opset_import if o.domain == "") == 13
    assert min(quant.output_cosines(m, q, QM.featuremaps(m, 2, seed=4)).values()) >= 0.99


def test_refusals(zoo):
    with pytest.raises(InvalidInput, match="asymmetric"):
        QO(calibration_type="default", asymmetric=True)
    with pytest.raises(InvalidInput):
        QO(calibration_type="entropy")
    with pytest.raises(InvalidInput, match="needs a quantized"):
        quant.calibrate(zoo.model, [], zoo.bpu, [], QO(calibration_type="load"))
    _, q = zoo.quantize(calibration_type="max")
    with pytest.raises(InvalidInput, match="calibration_type: load"):
        quant.calibrate(q, zoo.cal, zoo.bpu, [], QO(calibration_type="max"))
    with pytest.raises(InvalidInput, match="needs calibration data"):
        quant.calibrate(zoo.model, [], zoo.bpu, [], QO(calibration_type="kl"))
    with pytest.raises(InvalidInput, match="not an input"):
        quant.calibrate(zoo.model, zoo.cal, zoo.bpu, ["nope"], QO(calibration_type="max"))


def _reference_stats(values, bins=2048):
    """The statistics of one tensor over samples as the original sequential collector computed
    them: range over every sample, then a clipped int64 bin index per value."""
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    absmax = max(abs(lo), abs(hi))
    hist = np.zeros(bins, np.int64)
    for v in values:
        idx = np.minimum((np.abs(v.reshape(-1)) * np.float32(bins / absmax)).astype(np.int64), bins - 1)
        hist += np.bincount(idx, minlength=bins)
    moved = [np.moveaxis(v, 1, 0).reshape(v.shape[1], -1) for v in values]
    cmin = np.min([m.min(axis=1) for m in moved], axis=0)
    cmax = np.max([m.max(axis=1) for m in moved], axis=0)
    return lo, hi, hist, cmin, cmax


@pytest.mark.parametrize("workers", ["1", "2"])
def test_statistics_are_exact_whatever_the_number_of_sample_workers(zoo, monkeypatch, workers):
    """The two statistics passes run their samples on BPUEMU_HOST_THREADS workers and add each
    sample's summary in sample order: ranges, per-channel ranges and every histogram count equal
    the sequential reference, including the values at the top edge (|x| == absmax)."""
    from bpuemu.host.onnxgraph import open_session, with_outputs
    from bpuemu.host.quant.statistics import collect_statistics

    monkeypatch.setenv("BPUEMU_HOST_THREADS", workers)
    plan = zoo.quantize(calibration_type="max")[0].plan
    tensors = [t for t in plan.stat_tensors() if t not in zoo.cal[0]]
    stats = collect_statistics(plan.model, tensors, zoo.cal, plan.infos)
    sess = open_session(with_outputs(plan.model, tensors, plan.infos))
    per_sample = [sess.run(tensors, feed_for(sess, s)) for s in zoo.cal]
    for k, t in enumerate(tensors):
        lo, hi, hist, cmin, cmax = _reference_stats([outs[k] for outs in per_sample])
        st = stats[t]
        assert (st.min, st.max) == (lo, hi), t
        assert np.array_equal(st.hist, hist), t
        if st.channel_min is not None:
            assert np.array_equal(st.channel_min, cmin) and np.array_equal(st.channel_max, cmax), t


def test_default_search_chooses_the_same_with_one_or_two_sample_workers(zoo, monkeypatch):
    """The candidates' cosines (computed per sample in the workers, averaged in sample order) and
    the chosen parameters are identical to the last digit with 1 and 2 workers (the 2-worker run computes
    its own statistics: the calibration statistics cache would hand it the 1-worker run's)."""
    monkeypatch.setenv("BPUEMU_CALIBRATION_CACHE", "off")
    results = []
    for workers in ("1", "2"):
        monkeypatch.setenv("BPUEMU_HOST_THREADS", workers)
        results.append(quant.calibrate(zoo.model, zoo.cal, zoo.bpu, zoo.int8_inputs, QO(calibration_type="default")))
    one, two = results
    assert [(c.name, c.cosine, c.per_output) for c in one.candidates] == [(c.name, c.cosine, c.per_output) for c in two.candidates]
    assert len(one.candidates) >= 3 and one.activations.keys() == two.activations.keys()
    for t, q in one.activations.items():
        assert np.array_equal(q.scale, two.activations[t].scale) and np.array_equal(q.zero_point, two.activations[t].zero_point)


@pytest.mark.parametrize("compiled", [False, True])
def test_histogram_counts_equal_the_clipped_index_formula_across_blocks(compiled):
    """numpy bins statistics.HIST_CHUNK values at a time, the kernel kernels._BLOCK values into
    kernels._SUB sub-histograms: on a tensor of several chunks and blocks and a remainder, with
    values at exactly +-absmax (the top edge, folded into the last bin) and zeros, the counts of
    both equal one clipped int64 index array over the whole tensor."""
    from bpuemu.host.quant.kernels import _BLOCK, _SUB
    from bpuemu.host.quant.statistics import HIST_CHUNK

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 7, 3 * max(_BLOCK, HIST_CHUNK) // 7 + _SUB + 1)).astype(np.float32)
    absmax = float(np.abs(x).max())
    x[0, 0, :3] = [absmax, -absmax, 0.0]
    st = quant.TensorStats.of(x, compiled=compiled)
    idx = np.minimum((np.abs(x.reshape(-1)) * np.float32(2048 / absmax)).astype(np.int64), 2047)
    assert x.size > 3 * max(_BLOCK, HIST_CHUNK) and x.size % _SUB and x.size % HIST_CHUNK and st.hist.sum() == x.size
    assert np.array_equal(st.hist, np.bincount(idx, minlength=2048))


def _search_both_ways(case, monkeypatch, **opts):
    """quant.calibrate with the default search as it runs (candidates scored only as far as the choice
    needs) and exhaustive (every candidate on every evaluation sample): both results."""
    from bpuemu.host.quant import search

    lazy = quant.calibrate(case.model, case.cal, case.bpu, case.int8_inputs, QO(**opts))
    original = search.default_search
    monkeypatch.setattr(search, "default_search", lambda *a, **k: original(*a, exhaustive=True, **k))
    full = quant.calibrate(case.model, case.cal, case.bpu, case.int8_inputs, QO(**opts))
    monkeypatch.setattr(search, "default_search", original)
    return lazy, full





@pytest.mark.parametrize("target", [0.5, 0.995, 1.01])
def test_default_search_chooses_what_scoring_every_candidate_on_every_sample_chooses(zoo, monkeypatch, target):
    """Stopping at step 1 (target 0.5), the seed's target, and all five candidates (target 1.01): the
    choice and the parameters are the exhaustive search's; candidates it could rule out early were
    scored on fewer samples (what saves the time) with a bound that rules them out."""
    lazy, full = _search_both_ways(zoo, monkeypatch, search_target=target)
    assert_same_choice(lazy, full, len(zoo.cal))
    assert len(full.candidates) == (3 if target == 0.5 else 5 if target > 1 else len(full.candidates))
    if target > 1:
        assert any(c.samples < len(zoo.cal) for c in lazy.candidates)


def test_similarity_is_the_same_with_one_or_two_sample_threads(zoo, monkeypatch):
    """similarity runs two samples at once, each on a thread of its own (its float and quantized parts
    and its node cosines), and adds each sample's cosines in sample order: every node and output
    cosine equals the one-thread run's to the last digit."""
    _, q = zoo.quantize(calibration_type="default")
    results = []
    for workers in ("1", "2"):
        monkeypatch.setenv("BPUEMU_HOST_THREADS", workers)
        results.append(quant.similarity(zoo.model, q, zoo.held))
    one, two = results
    assert len(one.nodes) > 4 and len(set(one.nodes.values())) > 2
    assert (one.nodes, one.outputs, one.agreements) == (two.nodes, two.outputs, two.agreements)


def test_image_feeds_held_as_int8_calibrate_and_compare_as_float32_ones(image):
    """makertbin holds an image input's calibration feeds (X_128 values) as int8 (pipeline._compact):
    the statistics, the default search's choice and parameters, and the similarity are those of the
    float32 feeds, to the last digit."""
    from bpuemu.host.convert.pipeline import _compact

    small = [{k: _compact(v) for k, v in s.items()} for s in image.cal]
    assert all(v.dtype == np.int8 and np.array_equal(v, image.cal[i]["data"]) for i, s in enumerate(small) for v in s.values())
    assert _compact(np.array([0.5, 1.0], np.float32)).dtype == np.float32          # not int8 values: kept
    a = quant.calibrate(image.model, image.cal, image.bpu, image.int8_inputs, QO())
    b = quant.calibrate(image.model, small, image.bpu, image.int8_inputs, QO())
    assert [(c.name, c.cosine, c.samples) for c in a.candidates] == [(c.name, c.cosine, c.samples) for c in b.candidates]
    for t, q in a.activations.items():
        assert np.array_equal(q.scale, b.activations[t].scale) and np.array_equal(q.zero_point, b.activations[t].zero_point)
    qm = quant.build_quantized_model(image.model, a, image.int8_inputs)
    sa, sb = quant.similarity(image.model, qm, image.cal), quant.similarity(image.model, qm, small)
    assert (sa.nodes, sa.outputs) == (sb.nodes, sb.outputs)


def test_bias_of_a_near_zero_weight_channel_quantizes_without_a_numpy_warning():
    """A channel whose weights are all tiny (a pruned filter, trained to ~1e-39) has a scale s_x * s_w so
    small that |b| / scale overflows float32: the bias must still come out in range (its scale widened,
    as for any bias past int32) and without numpy's RuntimeWarning on the user's console."""
    import warnings

    from bpuemu.host.quant.emit import quantize_bias
    from bpuemu.host.quant.params import TensorQuant, quantize_weight

    w = np.ones((2, 3, 1, 1), np.float32)
    w[1] = 1e-39
    wq = quantize_weight("w", w, 0)
    xq = TensorQuant("x", "int8", np.float32(1e-3), np.int8(0), np.float32(0.127), "max")
    b = np.array([0.5, 1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q, scale = quantize_bias(b, xq, wq, 2)
    assert q.dtype == np.int32 and np.all(np.abs(q) <= 2 ** 31 - 1)
    np.testing.assert_allclose(q * scale, b, rtol=1e-6)

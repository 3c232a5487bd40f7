"""One converter per Caffe layer type: Caffe semantics -> ONNX (opset 11) nodes.

``CONVERTERS`` maps a Caffe type string to a function of a LayerContext that
emits nodes and binds the layer's tops. Caffe details that differ from ONNX
are handled here, next to the layer they belong to:

* Pooling rounds its output size up (ceil) and then drops a last window that
  would start in the padding; AVE divides by the window clipped to the padded
  input, not to the input. The converter pads explicitly to get both right.
* BatchNorm keeps a moving-average scale factor (third blob) that divides mean
  and variance; a BatchNorm followed by its Scale becomes one
  BatchNormalization (the optimizer folds it into the Conv before it).
* Softmax defaults to axis 1 and is per position on 4-D blobs (ONNX opset 11
  Softmax would flatten), ArgMax without an axis maximises over everything
  after the first axis (the seed: "Softmax layer defaults to axis=1, while
  ArgMax layer defaults to axis=0").
* Dropout and Split are identities at inference: their tops alias the bottom.
* SSD's PriorBox depends only on shapes: its boxes are computed here, a
  constant (a Concat of constants is folded too).
"""
import math
from typing import Callable, Dict, List, Sequence

import numpy as np
from onnx import numpy_helper

from bpuemu.host.caffe import caffe_pb2
from bpuemu.host.caffe.graph import LayerContext, axis_of

Converter = Callable[[LayerContext], None]
CONVERTERS: Dict[str, Converter] = {}

#: Layers the BPU toolchain leaves to the application (post-processing).
POSTPROCESS_LAYERS = ("DetectionOutput", "Proposal", "Python", "YoloDetectionOutput")


def converts(*types: str):
    def register(fn: Converter) -> Converter:
        for t in types:
            CONVERTERS[t] = fn
        return fn

    return register


def _hw(values: Sequence[int], h, w, default: int, ctx: LayerContext, what: str):
    """Caffe's 2-D parameter convention: repeated value (1 or 2 of them) or the _h/_w pair."""
    if h is not None and w is not None:
        return int(h), int(w)
    values = list(values)
    if not values:
        return default, default
    if len(values) == 1:
        return int(values[0]), int(values[0])
    if len(values) == 2:
        return int(values[0]), int(values[1])
    raise ctx.error(f"{what} has {len(values)} values; only 2-D layers are supported")


def _opt(p, field: str):
    return getattr(p, field) if p.HasField(field) else None


# --- inputs and identities ----------------------------------------------------------------------

@converts("Input")
def input_layer(ctx: LayerContext) -> None:
    shapes = ctx.layer.input_param.shape
    if not shapes:
        raise ctx.error("input_param gives no shape; give one, or --input-shape / input_shape in the yaml")
    for i, blob in enumerate(ctx.layer.top):
        shape = tuple(shapes[min(i, len(shapes) - 1)].dim)
        ctx.graph.add_input(blob, ctx.graph.input_shapes.get(blob, shape))


@converts("Dropout", "Split")
def identity(ctx: LayerContext) -> None:
    for i in range(len(ctx.layer.top)):
        ctx.top(ctx.x, i)


# --- convolution and inner product ---------------------------------------------------------------

def _conv_geometry(ctx: LayerContext):
    p = ctx.layer.convolution_param
    kh, kw = _hw(p.kernel_size, _opt(p, "kernel_h"), _opt(p, "kernel_w"), 0, ctx, "kernel_size")
    if not kh or not kw:
        raise ctx.error("convolution_param gives no kernel_size")
    ph, pw = _hw(p.pad, p.pad_h if p.HasField("pad_h") else None, p.pad_w if p.HasField("pad_w") else None, 0, ctx, "pad")
    sh, sw = _hw(p.stride, _opt(p, "stride_h"), _opt(p, "stride_w"), 1, ctx, "stride")
    dh, dw = _hw(p.dilation, None, None, 1, ctx, "dilation")
    if p.axis != 1:
        raise ctx.error(f"convolution axis {p.axis} is not supported (only the channel axis 1)")
    return (kh, kw), (ph, pw), (sh, sw), (dh, dw)


@converts("Convolution", "Deconvolution")
def convolution(ctx: LayerContext) -> None:
    p = ctx.layer.convolution_param
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = _conv_geometry(ctx)
    n, c, h, w = ctx.shape()
    weight = ctx.weight(0, "weight")
    group = int(p.group)
    deconv = ctx.layer.type == "Deconvolution"
    out_c = weight.shape[1] * group if deconv else weight.shape[0]
    weight = weight.reshape((c, out_c // group, kh, kw) if deconv else (out_c, c // group, kh, kw))
    inputs = [ctx.x, ctx.const("weight", weight)]
    if p.bias_term:
        inputs.append(ctx.const("bias", ctx.weight(1, "bias").reshape(-1)))
    attrs = dict(kernel_shape=[kh, kw], pads=[ph, pw, ph, pw], strides=[sh, sw], dilations=[dh, dw], group=group)
    if deconv:
        oh = sh * (h - 1) + dh * (kh - 1) + 1 - 2 * ph
        ow = sw * (w - 1) + dw * (kw - 1) + 1 - 2 * pw
        ctx.top(ctx.emit("ConvTranspose", inputs, (n, out_c, oh, ow), **attrs))
    else:
        oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
        ow = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
        ctx.top(ctx.emit("Conv", inputs, (n, out_c, oh, ow), **attrs))


@converts("InnerProduct")
def inner_product(ctx: LayerContext) -> None:
    p = ctx.layer.inner_product_param
    shape = ctx.shape()
    axis = axis_of(p.axis, len(shape), ctx)
    if axis != 1:
        raise ctx.error(f"inner_product axis {p.axis} is not supported (only 1)")
    k = int(np.prod(shape[1:]))
    weight = ctx.weight(0, "weight").reshape((k, -1) if p.transpose else (-1, k))
    x = ctx.x
    if len(shape) != 2:
        x = ctx.emit("Flatten", [x], (shape[0], k), suffix="flatten", axis=1)
    num_output = weight.shape[1] if p.transpose else weight.shape[0]
    bias = ctx.weight(1, "bias").reshape(-1) if p.bias_term else np.zeros(num_output, np.float32)
    out = ctx.emit("Gemm", [x, ctx.const("weight", weight), ctx.const("bias", bias)], (shape[0], num_output),
                   transB=0 if p.transpose else 1)
    ctx.top(out)


# --- pooling --------------------------------------------------------------------------------------

def _pooled(size: int, k: int, pad: int, stride: int) -> int:
    """Caffe's PoolingLayer::Reshape: ceil, then drop a window that starts in the end padding."""
    out = int(math.ceil((size + 2 * pad - k) / stride)) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@converts("Pooling")
def pooling(ctx: LayerContext) -> None:
    p = ctx.layer.pooling_param
    n, c, h, w = ctx.shape()
    if p.pool not in (caffe_pb2.PoolingParameter.MAX, caffe_pb2.PoolingParameter.AVE):
        raise ctx.error("STOCHASTIC pooling is a training-time layer; use MAX or AVE")
    is_max = p.pool == caffe_pb2.PoolingParameter.MAX
    if p.global_pooling:
        ctx.top(ctx.emit("GlobalMaxPool" if is_max else "GlobalAveragePool", [ctx.x], (n, c, 1, 1)))
        return
    kh, kw = _hw([p.kernel_size] if p.HasField("kernel_size") else [], _opt(p, "kernel_h"), _opt(p, "kernel_w"), 0,
                 ctx, "kernel_size")
    if not kh:
        raise ctx.error("pooling_param gives no kernel_size (and global_pooling is false)")
    ph, pw = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad, p.pad)
    sh, sw = _hw([p.stride], _opt(p, "stride_h"), _opt(p, "stride_w"), 1, ctx, "stride")
    oh, ow = _pooled(h, kh, ph, sh), _pooled(w, kw, pw, sw)
    # Extra end padding so that floor rounding over it gives Caffe's (ceil) size.
    eh, ew = max(0, (oh - 1) * sh + kh - h - 2 * ph), max(0, (ow - 1) * sw + kw - w - 2 * pw)
    if ph + eh >= kh or pw + ew >= kw:
        raise ctx.error(f"its last window (kernel {kh}x{kw}, stride {sh}x{sw}, pad {ph}x{pw}) lies outside the "
                        f"{h}x{w} input after Caffe's ceil rounding; use a stride no larger than the kernel")
    attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw])
    if is_max:  # max ignores padding: Caffe clips windows to the input, ONNX pads with -inf
        ctx.top(ctx.emit("MaxPool", [ctx.x], (n, c, oh, ow), pads=[ph, pw, ph + eh, pw + ew], **attrs))
        return
    x = ctx.x
    if (ph or pw) and (eh or ew):
        # Caffe divides by the window clipped to the *padded* input: zero-pad explicitly, then
        # exclude only the extra ceil padding from the count.
        padded = (n, c, h + 2 * ph, w + 2 * pw)
        pads = ctx.const("pads", np.array([0, 0, ph, pw, 0, 0, ph, pw], np.int64))
        x = ctx.emit("Pad", [x, pads], padded, suffix="pad", mode="constant")
        ph = pw = 0
    include_pad = 1 if (ph or pw) else 0
    ctx.top(ctx.emit("AveragePool", [x], (n, c, oh, ow), pads=[ph, pw, ph + eh, pw + ew],
                     count_include_pad=include_pad, **attrs))


# --- activations ----------------------------------------------------------------------------------

@converts("ReLU")
def relu(ctx: LayerContext) -> None:
    slope = ctx.layer.relu_param.negative_slope
    if slope:
        ctx.top(ctx.emit("LeakyRelu", [ctx.x], ctx.shape(), alpha=float(slope)))
    else:
        ctx.top(ctx.emit("Relu", [ctx.x], ctx.shape()))


@converts("PReLU")
def prelu(ctx: LayerContext) -> None:
    shape = ctx.shape()
    slope = ctx.weight(0, "slope").reshape(-1)
    if ctx.layer.prelu_param.channel_shared or slope.size == 1:
        slope = slope.reshape(1)
    else:
        slope = slope.reshape((-1,) + (1,) * (len(shape) - 2))  # per channel (axis 1)
    ctx.top(ctx.emit("PRelu", [ctx.x, ctx.const("slope", slope)], shape))


@converts("Sigmoid", "TanH", "AbsVal")
def unary(ctx: LayerContext) -> None:
    op = {"Sigmoid": "Sigmoid", "TanH": "Tanh", "AbsVal": "Abs"}[ctx.layer.type]
    ctx.top(ctx.emit(op, [ctx.x], ctx.shape()))


@converts("ELU")
def elu(ctx: LayerContext) -> None:
    ctx.top(ctx.emit("Elu", [ctx.x], ctx.shape(), alpha=float(ctx.layer.elu_param.alpha)))


@converts("Power")
def power(ctx: LayerContext) -> None:
    """y = (shift + scale * x) ^ power, one node per term that is not the identity."""
    p = ctx.layer.power_param
    x, shape = ctx.x, ctx.shape()
    steps = []
    if p.scale != 1:
        steps.append(("Mul", "scale", p.scale))
    if p.shift != 0:
        steps.append(("Add", "shift", p.shift))
    if p.power != 1:
        steps.append(("Pow", "power", p.power))
    if not steps:
        ctx.top(x)
        return
    for i, (op, what, value) in enumerate(steps):
        last = i == len(steps) - 1
        x = ctx.emit(op, [x, ctx.const(what, np.float32(value))], shape, suffix=None if last else what)
    ctx.top(x)


# --- normalisation --------------------------------------------------------------------------------

@converts("BatchNorm")
def batch_norm(ctx: LayerContext) -> None:
    eps = float(ctx.layer.batch_norm_param.eps)
    mean, var = ctx.weight(0, "mean").reshape(-1), ctx.weight(1, "variance").reshape(-1)
    factor = float(ctx.blobs[2].reshape(-1)[0]) if len(ctx.blobs) > 2 else 1.0
    factor = 0.0 if factor == 0 else 1.0 / factor  # Caffe: a zero factor means mean = var = 0
    c = mean.size
    inputs = [ctx.x, ctx.const("scale", np.ones(c, np.float32)), ctx.const("bias", np.zeros(c, np.float32)),
              ctx.const("mean", mean * factor), ctx.const("var", var * factor)]
    ctx.top(ctx.emit("BatchNormalization", inputs, ctx.shape(), epsilon=eps))


def _scale_params(ctx: LayerContext):
    p = ctx.layer.scale_param
    gamma = ctx.weight(0, "scale") if len(ctx.inputs) == 1 else None
    beta = None
    if p.bias_term:
        beta = ctx.weight(1 if gamma is not None else 0, "bias")
    return gamma, beta


def _fold_into_batch_norm(ctx: LayerContext, gamma, beta) -> bool:
    """A Scale right after a BatchNorm on the same blob becomes that BatchNormalization's scale and bias."""
    graph = ctx.graph
    node = graph.producer.get(ctx.x)
    shape = ctx.shape()
    # Blobs still naming the BatchNorm output after this layer (its bottom unless overwritten, Split aliases).
    aliases = {b for b, t in graph.blob_tensor.items() if t == ctx.x} - set(ctx.layer.top)
    if (node is None or node.op_type != "BatchNormalization" or graph.consumed.get(ctx.x, 0) or gamma is None
            or ctx.layer.scale_param.axis not in (1, 1 - len(shape)) or gamma.size != shape[1]
            or aliases & graph.read_later):  # a later layer reads the plain BatchNorm output
        return False
    inits = {t.name: t for t in graph.initializers}
    for index, value in ((1, gamma), (2, beta)):
        if value is not None:
            inits[node.input[index]].CopyFrom(numpy_helper.from_array(value.reshape(-1).astype(np.float32),
                                                                      node.input[index]))
    ctx.top(ctx.x)
    return True


@converts("Scale")
def scale(ctx: LayerContext) -> None:
    gamma, beta = _scale_params(ctx)
    if _fold_into_batch_norm(ctx, gamma, beta):
        return
    p = ctx.layer.scale_param
    shape = ctx.shape()
    axis = axis_of(p.axis, len(shape), ctx)

    def broadcastable(value: np.ndarray) -> np.ndarray:
        covered = value.ndim if value.size > 1 else 0
        return value.reshape(value.shape + (1,) * (len(shape) - axis - covered)) if covered else value.reshape(1)

    if gamma is not None:
        factor = ctx.const("scale", broadcastable(gamma.astype(np.float32)))
    else:  # the scale comes from the second bottom
        s = ctx.shape(ctx.inputs[1])
        factor = ctx.emit("Reshape", [ctx.inputs[1], ctx.const("shape", np.array(
            s + (1,) * (len(shape) - axis - len(s)), np.int64))], s + (1,) * (len(shape) - axis - len(s)),
            suffix="broadcast")
    x = ctx.emit("Mul", [ctx.x, factor], shape, suffix="mul" if beta is not None else None)
    if beta is not None:
        x = ctx.emit("Add", [x, ctx.const("bias", broadcastable(beta.astype(np.float32)))], shape)
    ctx.top(x)


@converts("LRN")
def lrn(ctx: LayerContext) -> None:
    p = ctx.layer.lrn_param
    if p.norm_region != caffe_pb2.LRNParameter.ACROSS_CHANNELS:
        raise ctx.error("LRN norm_region WITHIN_CHANNEL is not supported (only ACROSS_CHANNELS)")
    # ONNX LRN divides alpha by size, as Caffe's across-channel LRN does.
    ctx.top(ctx.emit("LRN", [ctx.x], ctx.shape(), size=int(p.local_size), alpha=float(p.alpha), beta=float(p.beta),
                     bias=float(p.k)))


@converts("Normalize")
def normalize(ctx: LayerContext) -> None:
    """SSD's L2 Normalize: x / sqrt(sum of squares + eps), over channels (or all of C, H, W), times a scale."""
    p = ctx.layer.norm_param
    shape = ctx.shape()
    axes = list(range(1, len(shape))) if p.across_spatial else [1]
    reduced = tuple(1 if a in axes else d for a, d in enumerate(shape))
    x = ctx.emit("ReduceSumSquare", [ctx.x], reduced, suffix="sumsq", axes=axes, keepdims=1)
    x = ctx.emit("Add", [x, ctx.const("eps", np.float32(p.eps))], reduced, suffix="eps")
    x = ctx.emit("Sqrt", [x], reduced, suffix="norm")
    x = ctx.emit("Div", [ctx.x, x], shape, suffix="div")
    scale = ctx.weight(0, "scale").reshape(-1)
    scale = scale.reshape(1) if p.channel_shared or scale.size == 1 else scale.reshape((-1,) + (1,) * (len(shape) - 2))
    ctx.top(ctx.emit("Mul", [x, ctx.const("scale", scale)], shape))


# --- SSD ------------------------------------------------------------------------------------------

def _aspect_ratios(p) -> List[float]:
    ratios = [1.0]
    for ar in p.aspect_ratio:
        if all(abs(ar - r) > 1e-6 for r in ratios):
            ratios.append(float(ar))
            if p.flip:
                ratios.append(1.0 / float(ar))
    return ratios


def prior_boxes(p: caffe_pb2.PriorBoxParameter, layer_hw, image_hw) -> np.ndarray:
    """SSD's PriorBoxLayer::Forward_cpu: (1, 2, H*W*priors*4), boxes then their variances."""
    (lh, lw), (ih, iw) = layer_hw, image_hw
    img_h = p.img_h or p.img_size or ih
    img_w = p.img_w or p.img_size or iw
    step_h = p.step_h or p.step or img_h / lh
    step_w = p.step_w or p.step or img_w / lw
    boxes = []
    for h in range(lh):
        for w in range(lw):
            cx, cy = (w + p.offset) * step_w, (h + p.offset) * step_h
            for s, min_size in enumerate(p.min_size):
                sizes = [(min_size, min_size)]
                if len(p.max_size) > s:
                    side = float(np.sqrt(min_size * p.max_size[s]))
                    sizes.append((side, side))
                sizes += [(min_size * np.sqrt(ar), min_size / np.sqrt(ar)) for ar in _aspect_ratios(p)[1:]]
                boxes += [((cx - bw / 2) / img_w, (cy - bh / 2) / img_h, (cx + bw / 2) / img_w, (cy + bh / 2) / img_h)
                          for bw, bh in sizes]
    top = np.asarray(boxes, np.float32).reshape(-1)
    if p.clip:
        top = np.clip(top, 0.0, 1.0)
    variance = list(p.variance) or [0.1]
    variances = np.tile(np.asarray(variance if len(variance) == 4 else variance[:1] * 4, np.float32), top.size // 4)
    return np.stack([top, variances])[None]


@converts("PriorBox")
def prior_box(ctx: LayerContext) -> None:
    """A constant for a fixed input size: computed here, nothing for the BPU or CPU to run."""
    p = ctx.layer.prior_box_param
    if not p.min_size:
        raise ctx.error("prior_box_param gives no min_size")
    if len(ctx.inputs) < 2 and not (p.img_size or (p.img_h and p.img_w)):
        raise ctx.error("PriorBox needs the image blob as second bottom, or img_size / img_h and img_w")
    image_hw = ctx.shape(ctx.inputs[1])[2:] if len(ctx.inputs) > 1 else (0, 0)
    ctx.top(ctx.const("priors", prior_boxes(p, ctx.shape()[2:], image_hw)))


# --- element-wise and structure -------------------------------------------------------------------

@converts("Eltwise")
def eltwise(ctx: LayerContext) -> None:
    p = ctx.layer.eltwise_param
    shape = ctx.shape()
    inputs = list(ctx.inputs)
    if p.operation == caffe_pb2.EltwiseParameter.SUM and p.coeff:
        if len(p.coeff) != len(inputs):
            raise ctx.error(f"Eltwise has {len(inputs)} bottoms and {len(p.coeff)} coeff values")
        inputs = [x if c == 1 else ctx.emit("Mul", [x, ctx.const(f"coeff{i}", np.float32(c))], shape, suffix=f"coeff{i}")
                  for i, (x, c) in enumerate(zip(inputs, p.coeff))]
    op = {caffe_pb2.EltwiseParameter.SUM: "Add", caffe_pb2.EltwiseParameter.PROD: "Mul",
          caffe_pb2.EltwiseParameter.MAX: "Max"}[p.operation]
    if op == "Max":
        ctx.top(ctx.emit("Max", inputs, shape))
        return
    acc = inputs[0]
    for i, x in enumerate(inputs[1:], start=1):
        acc = ctx.emit(op, [acc, x], shape, suffix=None if i == len(inputs) - 1 else f"part{i}")
    ctx.top(acc)


@converts("Concat")
def concat(ctx: LayerContext) -> None:
    p = ctx.layer.concat_param
    shapes = [ctx.shape(t) for t in ctx.inputs]
    axis = axis_of(p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim, len(shapes[0]), ctx)
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    if len(ctx.inputs) == 1:
        ctx.top(ctx.x)
        return
    constants = ctx.graph.constants()
    if all(t in constants for t in ctx.inputs):  # SSD's mbox_priorbox: priors of every feature map
        ctx.top(ctx.const("value", np.concatenate([constants[t] for t in ctx.inputs], axis=axis)))
        return
    ctx.top(ctx.emit("Concat", ctx.inputs, tuple(out), axis=axis))


@converts("Flatten")
def flatten(ctx: LayerContext) -> None:
    p = ctx.layer.flatten_param
    shape = ctx.shape()
    start, end = axis_of(p.axis, len(shape), ctx), axis_of(p.end_axis, len(shape), ctx)
    out = shape[:start] + (int(np.prod(shape[start:end + 1])),) + shape[end + 1:]
    if start == 1 and end == len(shape) - 1:
        ctx.top(ctx.emit("Flatten", [ctx.x], out, axis=1))
    else:
        ctx.top(ctx.emit("Reshape", [ctx.x, ctx.const("shape", np.array(out, np.int64))], out))


def _reshaped(shape, p: caffe_pb2.ReshapeParameter, ctx: LayerContext):
    """Caffe's ReshapeLayer: 0 copies a dimension, -1 is inferred, axis/num_axes choose the replaced span."""
    rank = len(shape)
    start = p.axis if p.axis >= 0 else rank + p.axis + 1
    end = rank if p.num_axes == -1 else start + p.num_axes
    if not 0 <= start <= end <= rank:
        raise ctx.error(f"reshape axis {p.axis} / num_axes {p.num_axes} do not fit a {rank}-D blob")
    dims = [shape[start + i] if d == 0 else int(d) for i, d in enumerate(p.shape.dim)]
    out = list(shape[:start]) + dims + list(shape[end:])
    if out.count(-1) > 1:
        raise ctx.error("reshape has more than one -1 dimension")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // max(known, 1)
    if int(np.prod(out)) != int(np.prod(shape)):
        raise ctx.error(f"cannot reshape {'x'.join(map(str, shape))} to {'x'.join(map(str, out))}")
    return tuple(out)


@converts("Reshape")
def reshape(ctx: LayerContext) -> None:
    out = _reshaped(ctx.shape(), ctx.layer.reshape_param, ctx)
    ctx.top(ctx.emit("Reshape", [ctx.x, ctx.const("shape", np.array(out, np.int64))], out))


@converts("Permute")
def permute(ctx: LayerContext) -> None:
    shape = ctx.shape()
    order = [int(o) for o in ctx.layer.permute_param.order]
    order += [a for a in range(len(shape)) if a not in order]
    if sorted(order) != list(range(len(shape))):
        raise ctx.error(f"permute order {list(ctx.layer.permute_param.order)} is not a permutation of the axes")
    ctx.top(ctx.emit("Transpose", [ctx.x], tuple(shape[a] for a in order), perm=order))


@converts("Slice")
def slice_layer(ctx: LayerContext) -> None:
    p = ctx.layer.slice_param
    shape = ctx.shape()
    axis = axis_of(p.axis if p.HasField("axis") or not p.HasField("slice_dim") else p.slice_dim, len(shape), ctx)
    tops = len(ctx.layer.top)
    if p.slice_point:
        points = [0] + [int(s) for s in p.slice_point] + [shape[axis]]
        sizes = [b - a for a, b in zip(points, points[1:])]
    else:
        if shape[axis] % tops:
            raise ctx.error(f"cannot slice {shape[axis]} into {tops} equal parts")
        sizes = [shape[axis] // tops] * tops
    if len(sizes) != tops or any(s <= 0 for s in sizes):
        raise ctx.error(f"slice_point {list(p.slice_point)} does not give {tops} non-empty parts")
    shapes = [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes]
    for i, out in enumerate(ctx.emit_many("Split", [ctx.x], shapes, axis=axis, split=sizes)):
        ctx.top(out, i)


@converts("Softmax")
def softmax(ctx: LayerContext) -> None:
    shape = ctx.shape()
    axis = axis_of(ctx.layer.softmax_param.axis, len(shape), ctx)
    if axis == len(shape) - 1:
        ctx.top(ctx.emit("Softmax", [ctx.x], shape, axis=axis))
        return
    # Opset-11 Softmax normalises over all axes from `axis` on; Caffe's over `axis` alone.
    perm = [a for a in range(len(shape)) if a != axis] + [axis]
    moved = tuple(shape[a] for a in perm)
    x = ctx.emit("Transpose", [ctx.x], moved, suffix="to_last", perm=perm)
    x = ctx.emit("Softmax", [x], moved, suffix="softmax", axis=len(shape) - 1)
    back = [perm.index(a) for a in range(len(shape))]
    ctx.top(ctx.emit("Transpose", [x], shape, perm=back))


@converts("ArgMax")
def argmax(ctx: LayerContext) -> None:
    """Indices as float, like Caffe; without an axis over all axes after the first (out (N, 1, top_k))."""
    p = ctx.layer.argmax_param
    shape = ctx.shape()
    k = int(p.top_k)
    x = ctx.x
    if p.HasField("axis"):
        axis = axis_of(p.axis, len(shape), ctx)
        work = shape
    else:
        axis, work = 1, (shape[0], int(np.prod(shape[1:])))
        x = ctx.emit("Reshape", [x, ctx.const("flat", np.array(work, np.int64))], work, suffix="flatten")
    if k > work[axis]:
        raise ctx.error(f"top_k {k} is larger than the {work[axis]} values it chooses from")
    picked = work[:axis] + (k,) + work[axis + 1:]
    if k == 1 and not p.out_max_val:  # the common case, as ONNX ArgMax (which the BPU runs)
        values, indices = None, ctx.emit("ArgMax", [x], picked, suffix="argmax", axis=axis, keepdims=1)
    else:
        values, indices = ctx.emit_many("TopK", [x, ctx.const("k", np.array([k], np.int64))], [picked, picked],
                                        suffix="topk", axis=axis)
    if p.HasField("axis"):  # Caffe gives the values alone with out_max_val, else the indices
        ctx.top(ctx.emit("Identity", [values], picked) if p.out_max_val else ctx.emit("Cast", [indices], picked, to=1))
        return
    as_float = ctx.emit("Cast", [indices], picked, suffix="index", to=1)
    parts = [as_float, values] if p.out_max_val else [as_float]
    out = (shape[0], len(parts), k)
    reshaped = [ctx.emit("Reshape", [t, ctx.const(f"shape{i}", np.array((shape[0], 1, k), np.int64))],
                         (shape[0], 1, k), suffix=None if len(parts) == 1 else f"part{i}") for i, t in enumerate(parts)]
    ctx.top(reshaped[0] if len(parts) == 1 else ctx.emit("Concat", reshaped, out, axis=1))


def supported_types() -> List[str]:
    return sorted(CONVERTERS)

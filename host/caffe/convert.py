"""Caffe deploy net -> float ONNX model (the model-analysis stage of makertbin for --model-type caffe).

    model = caffe_to_onnx("net.prototxt", "net.caffemodel", {"data": (1, 3, 224, 224)})

Every layer type is checked before anything is converted, so an unsupported
net is refused with one ``Not support layer name=... type=...`` line per
unsupported layer (the seed's wording), all at once. ``output_nodes`` (layer
names) cuts the net first: only the layers those outputs need are converted,
so a net that ends in post-processing layers (SSD's PriorBox and
DetectionOutput) converts up to the layers before them.
"""
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.host.caffe.graph import Graph, LayerContext
from bpuemu.host.caffe.layers import CONVERTERS, POSTPROCESS_LAYERS
from bpuemu.host.caffe.reader import CaffeNet, declared_inputs, in_test_phase, layers_of, load_net, read_prototxt

log = logging.getLogger("bpuemu.host.caffe")


class UnsupportedLayers(InvalidInput):
    """Layers with no converter; the message has one seed-style line per layer."""


def _needed(layers, output_nodes: Sequence[str]):
    """The layers that the outputs of ``output_nodes`` depend on, in net order."""
    index = {layer.name: i for i, layer in enumerate(layers)}
    missing = [n for n in output_nodes if n not in index]
    if missing:
        raise InvalidInput(f"output_nodes names {', '.join(repr(m) for m in missing)}, which "
                           f"{'is not a layer' if len(missing) == 1 else 'are not layers'} of the prototxt")
    wanted = {index[n] for n in output_nodes}
    needed_blobs, keep = set(), []
    for i in range(max(wanted), -1, -1):
        layer = layers[i]
        if i in wanted or needed_blobs & set(layer.top):
            keep.append(i)
            needed_blobs -= set(layer.top)
            needed_blobs |= set(layer.bottom)
    return [layers[i] for i in sorted(keep)]


def _check_supported(layers) -> None:
    bad = [layer for layer in layers if layer.type not in CONVERTERS]
    if not bad:
        return
    lines = [f"Not support layer name={layer.name} type={layer.type}" for layer in bad]
    hint = ""
    post = [layer.name for layer in bad if layer.type in POSTPROCESS_LAYERS]
    if post:
        hint = (f"{', '.join(post)} {'is' if len(post) == 1 else 'are'} post-processing that the application runs on the "
                "CPU: set model_parameters.output_nodes to the layers just before them (a ';'-separated list of "
                "layer names) to convert the rest")
    raise UnsupportedLayers("\n".join(lines), hint=hint)


def _net_outputs(layers) -> List[str]:
    """Blobs written and not read afterwards (Caffe's net outputs), in order of first write."""
    unread: Dict[str, bool] = {}
    for layer in layers:
        for b in layer.bottom:
            unread[b] = False
        for t in layer.top:
            unread[t] = True
    return [b for b, is_unread in unread.items() if is_unread]


def _rename(model: onnx.ModelProto, old: str, new: str) -> None:
    g = model.graph
    for node in g.node:
        node.input[:] = [new if t == old else t for t in node.input]
        node.output[:] = [new if t == old else t for t in node.output]
    for vi in list(g.input) + list(g.output):
        if vi.name == old:
            vi.name = new


def _name_outputs_after_blobs(model: onnx.ModelProto, outputs: Dict[str, str], graph: Graph) -> None:
    """Graph outputs carry their Caffe blob names, even when the blob was last written in place."""
    for blob, tensor in outputs.items():
        if tensor == blob:
            continue
        if graph.is_used(blob):
            _rename(model, blob, graph.unique(f"{blob}_before_{tensor}"))
        _rename(model, tensor, blob)
        graph.unique(blob)  # reserve it


def inputs_of(net_inputs: Dict[str, Tuple[int, ...]], layers) -> List[Tuple[str, Tuple[int, ...]]]:
    found = list(net_inputs.items())
    for layer in layers:
        if layer.type == "Input":
            shapes = layer.input_param.shape
            for i, blob in enumerate(layer.top):
                found.append((blob, tuple(shapes[min(i, len(shapes) - 1)].dim) if shapes else ()))
    return found


def caffe_inputs(prototxt: str) -> List[Tuple[str, List[Optional[int]]]]:
    """(name, shape) of a prototxt's inputs, unknown dims as None (like makertbin.model_inputs for ONNX)."""
    net = read_prototxt(prototxt)
    layers = [layer for layer in layers_of(net) if in_test_phase(layer)]
    return [(name, [d if d > 0 else None for d in shape]) for name, shape in inputs_of(declared_inputs(net), layers)]


def _convert_layers(graph: Graph, net: CaffeNet, layers, output_nodes: Sequence[str]) -> Dict[str, str]:
    """Run each layer's converter in net order; returns blob -> tensor for the tops of ``output_nodes``."""
    requested: Dict[str, str] = {}
    read_after = [set() for _ in layers]  # blobs that layers after layer i read
    for i in range(len(layers) - 2, -1, -1):
        read_after[i] = read_after[i + 1] | set(layers[i + 1].bottom)
    for i, layer in enumerate(layers):
        graph.read_later = read_after[i]
        CONVERTERS[layer.type](LayerContext(graph, layer, net.blobs.get(layer.name, [])))
        if layer.name in output_nodes:
            requested.update({t: graph.blob_tensor[t] for t in layer.top})
    return requested


def _model_outputs(graph: Graph, layers, requested: Dict[str, str]) -> Dict[str, str]:
    """blob -> tensor of the model outputs: the requested ones, else Caffe's (blobs no layer reads afterwards)."""
    outputs = requested or {b: graph.blob_tensor[b] for b in _net_outputs(layers) if b in graph.blob_tensor}
    inputs = {vi.name for vi in graph.inputs}
    outputs = {b: t for b, t in outputs.items() if t not in inputs}
    constants = graph.constants()
    for blob in [b for b, t in outputs.items() if t in constants]:
        # A runtime output must be computed; the priors are known before any input arrives.
        log.warning("output %s is a constant (e.g. SSD's prior boxes for this input size), not something the model "
                    "computes: it is left out of the model; the application computes it "
                    "(bpuemu.host.caffe.layers.prior_boxes gives the same values)", blob)
        del outputs[blob]
    if not outputs:
        raise InvalidInput("the Caffe net has no output that depends on its input")
    return outputs


def convert_net(net: CaffeNet, input_shapes: Optional[Dict[str, Tuple[int, ...]]] = None,
                output_nodes: Sequence[str] = ()) -> onnx.ModelProto:
    layers = _needed(net.layers, output_nodes) if output_nodes else net.layers
    _check_supported(layers)
    graph = Graph(net.name)
    graph.input_shapes = {k: tuple(v) for k, v in (input_shapes or {}).items()}
    unknown = set(graph.input_shapes) - {n for n, _ in inputs_of(net.inputs, layers)}
    if unknown:
        raise InvalidInput(f"input shapes name {sorted(unknown)}, which are not inputs of the Caffe net")
    for name, shape in net.inputs.items():
        graph.add_input(name, graph.input_shapes.get(name, shape))
    outputs = _model_outputs(graph, layers, _convert_layers(graph, net, layers, output_nodes))
    model = graph.model(list(outputs.values()))
    _name_outputs_after_blobs(model, outputs, graph)
    onnx.checker.check_model(model)
    log.info("converted Caffe net '%s': %d layer(s) -> %d ONNX node(s), outputs %s", net.name, len(layers),
             len(model.graph.node), ", ".join(outputs))
    return model


def caffe_to_onnx(prototxt: str, caffemodel: str, input_shapes: Optional[Dict[str, Tuple[int, ...]]] = None,
                  output_nodes: Sequence[str] = ()) -> onnx.ModelProto:
    """The float ONNX model of a Caffe 1.0 deploy prototxt + caffemodel."""
    return convert_net(load_net(prototxt, caffemodel), input_shapes, output_nodes)

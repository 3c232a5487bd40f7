"""Rebuild a published X5 architecture with random weights and export it to ONNX.

    python bench/x5_export.py --model timm:resnet18 224x224 m.onnx [--model ...]

Needs torch and, per source, timm / torchvision / ultralytics (the ``x5bench`` extra);
imports nothing of bpuemu, so any Python that has torch can run it (bench/x5_timing.py
calls it in a subprocess, ``--torch-python``). No network: pretrained=False everywhere,
ultralytics models are built from their yaml.

How each ``architecture_source`` (bench/x5_fit.csv, bench/x5_check.csv) is rebuilt:

- ``timm:NAME``: ``timm.create_model(NAME, pretrained=False)``, then
  ``timm.utils.model.reparameterize_model`` (fuses MobileOne, RepVGG, FastViT, ...; a no-op
  on nets without re-parameterisable blocks).
- ``torchvision:NAME`` (optional ``(key=value, ...)`` constructor arguments):
  ``torchvision.models.get_model(NAME, weights=None, ...)``.
- ``ultralytics:YAML``: built from the yaml, fused (conv+bn), heads cut as the RDK model zoo
  deploys them on the BPU: per scale the class conv branch and the box conv branch are
  outputs (segmentation: also the mask-coefficient branch per scale and the prototype;
  pose: the keypoint branch), each permuted to NHWC; no DFL decoding, no anchors, no NMS;
  YOLOv10's one-to-one branch; classification: the logits (no softmax). The attention of
  C2PSA / PSA blocks computes its softmax over a channel axis (the zoo's BPU-friendly form).

Batch 1, opset 11 (``--opset``), input name ``images`` for ultralytics, ``input`` otherwise.
"""
import argparse
import warnings
import os
import re
import sys
import types


def parse_source(source):
    """``"timm:resnet18"`` -> ("timm", "resnet18", {}); ``"torchvision:googlenet (aux_logits=False)"``
    -> ("torchvision", "googlenet", {"aux_logits": False})."""
    m = re.fullmatch(r"\s*(\w+):([\w.\-]+)\s*(?:\((.*)\))?\s*", source)
    if not m:
        raise ValueError(f"architecture_source {source!r} is not KIND:NAME [(key=value, ...)]")
    kind, name, args = m.group(1), m.group(2), m.group(3)
    kwargs = {}
    for part in filter(None, (p.strip() for p in (args or "").split(","))):
        key, _, value = part.partition("=")
        value = value.strip()
        kwargs[key.strip()] = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    return kind, name, kwargs


def build_timm(name, kwargs):
    import timm
    from timm.layers import set_fused_attn
    from timm.utils.model import reparameterize_model

    # torch's fused scaled_dot_product_attention has no ONNX form below opset 14: export the
    # explicit softmax(q k^T) v instead (FastViT-SA, ...).
    set_fused_attn(False)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    return reparameterize_model(model), "input"


def build_torchvision(name, kwargs):
    import torchvision

    if name == "googlenet":
        kwargs.setdefault("init_weights", True)
    return torchvision.models.get_model(name, weights=None, **kwargs).eval(), "input"


def _nhwc(t):
    return t.permute(0, 2, 3, 1).contiguous()


def _detect_outputs(head, feats, extra=None):
    """Per scale: class branch, box branch (and ``extra``'s branch), each NHWC."""
    one2one = getattr(head, "one2one_cv2", None) is not None
    cls = head.one2one_cv3 if one2one else head.cv3
    box = head.one2one_cv2 if one2one else head.cv2
    out = []
    for i, x in enumerate(feats):
        out += [_nhwc(cls[i](x)), _nhwc(box[i](x))]
        if extra is not None:
            out.append(_nhwc(extra[i](x)))
    return out


def _detect_forward(self, x):
    return _detect_outputs(self, x)


def _segment_forward(self, x):
    return _detect_outputs(self, x, self.cv4) + [_nhwc(self.proto(x[0]))]


def _pose_forward(self, x):
    return _detect_outputs(self, x, self.cv4)


def _classify_forward(self, x):
    import torch

    if isinstance(x, list):
        x = torch.cat(x, 1)
    return self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))


def _attention_forward(self, x):
    """ultralytics' Attention (C2PSA, PSA) with the softmax taken over a channel axis: the
    attention map goes to (B, keys, heads, queries), max / exp / sum / div over the keys, and
    back, as the model zoo exports it for the Bayes-e BPU."""
    import torch

    b, c, h, w = x.shape
    n = h * w
    q, k, v = self.qkv(x).view(b, self.num_heads, 2 * self.key_dim + self.head_dim, n).split(
        [self.key_dim, self.key_dim, self.head_dim], dim=2)
    scores = (q.transpose(-2, -1) @ k) * self.scale          # B, heads, queries, keys
    scores = scores.permute(0, 3, 1, 2).contiguous()          # B, keys, heads, queries
    e = torch.exp(scores - scores.max(dim=1, keepdim=True).values)
    probs = (e / e.sum(dim=1, keepdim=True)).permute(0, 2, 3, 1).contiguous()
    y = (v @ probs.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
    return self.proj(y)


def build_ultralytics(yaml_name, kwargs):
    from ultralytics.nn.modules.block import Attention
    from ultralytics.nn.modules.head import Classify, Detect, OBB, Pose, Segment
    from ultralytics.nn.tasks import yaml_model_load, guess_model_task, ClassificationModel, DetectionModel, PoseModel, SegmentationModel

    cfg = yaml_model_load(yaml_name)
    task = guess_model_task(cfg)
    cls = {"detect": DetectionModel, "segment": SegmentationModel, "pose": PoseModel,
           "classify": ClassificationModel}.get(task)
    if cls is None:
        raise ValueError(f"{yaml_name}: task {task!r} is not rebuilt here")
    model = cls(cfg, verbose=False, **kwargs)
    model = model.fuse(verbose=False).eval()
    for m in model.modules():
        if isinstance(m, OBB):
            raise ValueError(f"{yaml_name}: OBB heads are not cut here")
        if isinstance(m, Segment):
            m.forward = types.MethodType(_segment_forward, m)
        elif isinstance(m, Pose):
            m.forward = types.MethodType(_pose_forward, m)
        elif isinstance(m, Detect):
            m.forward = types.MethodType(_detect_forward, m)
        elif isinstance(m, Classify):
            m.forward = types.MethodType(_classify_forward, m)
        elif isinstance(m, Attention):
            m.forward = types.MethodType(_attention_forward, m)
    return model, "images"


BUILDERS = {"timm": build_timm, "torchvision": build_torchvision, "ultralytics": build_ultralytics}


def export(source, height, width, out, opset=11):
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch

    kind, name, kwargs = parse_source(source)
    if kind not in BUILDERS:
        raise ValueError(f"architecture_source kind {kind!r}: expected one of {sorted(BUILDERS)}")
    torch.manual_seed(0)
    model, input_name = BUILDERS[kind](name, kwargs)
    model.eval()
    dummy = torch.randn(1, 3, height, width)
    with torch.no_grad():
        outs = model(dummy)
    n_out = len(outs) if isinstance(outs, (list, tuple)) else 1
    names = ["output"] if n_out == 1 else [f"output{i}" for i in range(n_out)]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".part"
    with torch.no_grad():
        torch.onnx.export(model, (dummy,), tmp, opset_version=opset, input_names=[input_name], output_names=names,
                          dynamo=False, do_constant_folding=True)
    os.replace(tmp, out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs=3, action="append", required=True, metavar=("SOURCE", "HxW", "OUT"),
                   help="architecture_source (e.g. timm:resnet18), input size, the .onnx to write; repeatable "
                        "(one process exports them all: torch imports once)")
    p.add_argument("--opset", type=int, default=11)
    a = p.parse_args(argv)
    failed = 0
    for source, hw, out in a.model:
        h, w = (int(v) for v in hw.lower().split("x"))
        try:
            export(source, h, w, out, a.opset)
        except Exception as e:  # one line per model for the caller's status table, never a traceback
            # torch's export errors carry the whole graph: keep the last line (the reason)
            reason = ([ln for ln in str(e).splitlines() if ln.strip()] or [""])[-1][:300]
            print(f"ERROR export {source} {hw}: {type(e).__name__}: {reason}", file=sys.stderr, flush=True)
            failed += 1
            continue
        print(f"exported {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

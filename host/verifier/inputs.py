"""hb_verifier's inputs: ``-i`` files or random data, in input_type_rt form.

Every side starts from the same input_type_rt data (what the board's
application would feed): the `.bin` sides take it as is, and quanti.onnx takes
``to_model_input(data, spec)``, exactly what the board's Preprocess step does.

``-i`` items are images (``.jpg/.jpeg/.png``: decoded, resized to the model's
H and W, converted to the input's input_type_rt) or raw ``.bin`` files
(input_type_rt bytes, e.g. uint8 NHWC rgb or nv12); ``.npy`` arrays are
accepted too. A multi-input model takes ``name1:f1,name2:f2`` or ``f1,f2``
(model input order).
"""
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import random_rt_inputs
from bpuemu.common.proto import model_pb2

SUFFIXES = (".jpg", ".jpeg", ".png", ".bin", ".npy")


@dataclass
class VerifyInput:
    """One model input: its data in input_type_rt form and where it came from."""

    name: str
    data: np.ndarray
    source: str  # a file path, or "random (seed N)"


def parse_input_arg(value: str) -> List[Tuple[Optional[str], str]]:
    """``name1:f1,name2:f2`` or ``f1,f2`` -> [(name or None, path)]."""
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    out = []
    for item in items:
        name, sep, path = item.partition(":")
        if sep and name and path and not os.path.exists(item):
            out.append((name, path))
        else:
            out.append((None, item))
    return out


def _order(items: List[Tuple[Optional[str], str]], specs: Sequence[model_pb2.InputSpec]) -> List[str]:
    names = [s.name for s in specs]
    if len(items) != len(specs):
        raise InvalidInput(f"the model has {len(specs)} input(s) ({', '.join(names)}) but {len(items)} input file(s) were given",
                           hint="give one file per input, by input name or in the model's input order",
                           subject="input_file")
    named = [n for n, _ in items if n is not None]
    if not named:
        return [p for _, p in items]
    if len(named) != len(items):
        raise InvalidInput("give every input file a name (name1:f1,name2:f2) or none (f1,f2), not a mix")
    by_name = dict(items)
    unknown = [n for n in named if n not in names]
    if unknown:
        raise InvalidInput(f"-i names input(s) {', '.join(unknown)} that the model lacks; its inputs are: {', '.join(names)}")
    if len(set(named)) != len(named):
        raise InvalidInput("-i names an input twice")
    return [by_name[n] for n in names]


def load_inputs(value: str, specs: Sequence[model_pb2.InputSpec]) -> List[VerifyInput]:
    """Read the ``-i`` files for ``specs`` (model input order)."""
    from bpuemu.board.runtime.inputs import read_input  # the board's own reader: one source of truth

    paths = _order(parse_input_arg(value), specs)
    out = []
    for spec, path in zip(specs, paths):
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in SUFFIXES:
            raise InvalidInput(f"input file {path}: use an image (.jpg/.jpeg/.png) or raw input_type_rt data (.bin)",
                               hint="binary input files must have the .bin extension")
        if suffix in (".jpg", ".jpeg", ".png") and spec.input_type_rt == "featuremap":
            raise InvalidInput(f"input '{spec.name}' is a featuremap; give it a .bin file, not the image {path}")
        out.append(VerifyInput(spec.name, read_input(path, spec), path))
    return out


def random_inputs(specs: Sequence[model_pb2.InputSpec], seed: int = 0) -> List[VerifyInput]:
    """Random images (uint8 in input_type_rt form) or featuremaps (standard normal)."""
    return [VerifyInput(s.name, x, f"random {s.input_type_rt} (seed {seed})")
            for s, x in zip(specs, random_rt_inputs(specs, seed))]

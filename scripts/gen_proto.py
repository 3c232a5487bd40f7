#!/usr/bin/env python3
"""Regenerate the Python protobuf/gRPC code from proto/.

    python scripts/gen_proto.py            # rewrite common/proto/*_pb2*.py and host/caffe/caffe_pb2.py
    python scripts/gen_proto.py --out DIR  # write them all to DIR instead (the
                                           # staleness test compares the two)

Two targets (``TARGETS``): the board's wire format and .bin manifest
(proto/bpuemu/board/v1 -> bpuemu.common.proto, shared by host and board) and
the Caffe schema subset (proto/bpuemu/caffe -> bpuemu.host.caffe, host only:
the board never reads Caffe files). protoc names modules after the proto
package path (bpuemu.board.v1); the code is imported as bpuemu.common.proto,
so the cross-file imports are rewritten. Needs the grpcio-tools version pinned
in pyproject.toml's [test] extra.
"""
import argparse
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO_PACKAGE = "bpuemu/board/v1"
OUT_DIR = ROOT / "common" / "proto"
#: proto package directory -> where its generated modules are committed.
TARGETS = {PROTO_PACKAGE: OUT_DIR, "bpuemu/caffe": ROOT / "host" / "caffe"}


def generate(out_dir: pathlib.Path, package: str = PROTO_PACKAGE) -> list:
    from grpc_tools import protoc  # dev-only dependency

    protos = sorted((PROTO_DIR / package).glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
        args += [str(p.relative_to(PROTO_DIR)) for p in protos]
        if protoc.main(args) != 0:
            sys.exit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((pathlib.Path(tmp) / package).glob("*.py")):
            text = src.read_text()
            if src.name.endswith("_pb2_grpc.py") and "Stub" not in text:
                continue  # a proto without services
            text = text.replace("from bpuemu.board.v1 import", "from bpuemu.common.proto import")
            (out_dir / src.name).write_text(text)
            written.append(src.name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="one directory for every target's files")
    args = parser.parse_args()
    for package, committed in TARGETS.items():
        out = args.out or committed
        for name in generate(out, package):
            print(out / name)


if __name__ == "__main__":
    main()

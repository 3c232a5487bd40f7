"""The generated protobuf code in common/proto/ must match proto/ exactly."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_code_is_fresh(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.py")}
    committed = {p.name: p.read_text() for d in ("common/proto", "host/caffe") for p in (ROOT / d).glob("*_pb2*.py")}
    assert fresh, "gen_proto.py produced nothing"
    assert sorted(fresh) == sorted(committed), "generated file set differs: run python scripts/gen_proto.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated code {stale}: run python scripts/gen_proto.py"


def test_staleness_check_catches_a_change(tmp_path):
    """The comparison above is not vacuous: editing a .proto changes the output."""
    import shutil

    proto_copy = tmp_path / "repo"
    shutil.copytree(ROOT / "proto", proto_copy / "proto")
    shutil.copytree(ROOT / "scripts", proto_copy / "scripts")
    target = proto_copy / "proto" / "bpuemu" / "board" / "v1" / "model.proto"
    target.write_text(target.read_text().replace("string producer = 4;", "string producer = 4;\n  string extra = 5;"))
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(proto_copy / "scripts" / "gen_proto.py"), "--out", str(out)], check=True,
                   capture_output=True)
    assert (out / "model_pb2.py").read_text() != (ROOT / "common" / "proto" / "model_pb2.py").read_text()

"""bench/rerun_ab.py runs end to end: two checkouts (here the same one twice) converted again in turn."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_rerun_ab_small_run(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "rerun_ab.py"), "--before", str(ROOT), "--after", str(ROOT),
                           "--models", "sample", "--samples", "4", "--rounds", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert len(re.findall(r"^(before|after) round \d/2: wall [\d.]+ s, CPU [\d.]+ s, peak \d+ MB", out, re.M)) == 4, out
    assert "same cosine table: True; same artifacts (four ONNX files; the .bin without its working_dir): True" in out, out
    for side in ("before", "after"):
        line = next(x for x in out.splitlines() if x.startswith(f"{side}: median wall"))
        assert all(f"{stage} " in line for stage in ("statistics", "search", "cosine table", "emit/compile", "the rest")), line
    assert re.search(r"^after / before wall: [\d.]+$", out, re.M), out
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran

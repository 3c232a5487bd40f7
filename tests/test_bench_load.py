"""bench/load.py runs end to end on a small load and meets its own goals (it exits 1 when it misses one)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_load_bench_small_run(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--clients", "3", "--calls", "25",
                           "--size", "16", "--max-seconds", "30"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Traceback" not in proc.stderr
    for transport in ("[data channel] 75 calls", "[gRPC Infer] 75 calls"):
        assert transport in out, out
    assert out.count("errors     : 0") == 2 and out.count("board served 75 of them") == 2, out
    m = re.search(r"before ([\d.]+) MB, after ([\d.]+) MB, growth ([+-][\d.]+) MB", out)
    assert m and float(m.group(1)) > 10 and float(m.group(2)) > 10, out
    assert "RESULT      : PASS" in out
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran

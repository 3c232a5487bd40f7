"""bench/soak.py runs end to end for a few seconds and meets its own goals (it exits 1 when it misses one)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_soak_bench_short_run(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.1", "--interval", "2",
                           "--fault-every", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Traceback" not in proc.stderr
    rows = re.findall(r"^\s*[\d.]+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+.*\s([\d.]+)\s+(\d+)\s+(\d+)$", out, flags=re.M)
    assert len(rows) == 3, out  # one line per 2 s interval
    assert all(int(calls) > 0 and int(unexpected) == 0 for calls, unexpected, *_ in rows), out
    assert all(float(rss) > 10 and int(fds) > 0 for *_, rss, fds, threads in rows), out
    kills = int(re.search(r"clients killed mid-call: (\d+)", out).group(1))
    assert kills >= 1, out
    for kind in ("infer_data", "infer_grpc", "upload_known", "upload_new", "health"):
        assert re.search(rf"\b{kind} [1-9]\d*", out), f"no {kind} call made:\n{out}"
    assert "RESULT     : PASS" in out
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran

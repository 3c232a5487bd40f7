"""bpuemu.common.atomic: all of a run's outputs or none, also when the writer is killed."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bpuemu.common.atomic import Staging, atomic_output, recover_stale, staged_dir, write_file_atomic


def _tree(directory):
    """{relative path: bytes} of every file under ``directory``."""
    out = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, directory)] = f.read()
    return out


def test_write_file_atomic_replaces_whole_and_keeps_a_plain_files_mode(tmp_path):
    p = tmp_path / "out.txt"
    write_file_atomic(p, "one")
    write_file_atomic(p, b"two")
    assert p.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["out.txt"]
    assert p.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    old = os.umask(0)
    os.umask(old)
    return old


def test_atomic_output_failure_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")
    with pytest.raises(KeyError):
        with atomic_output(p) as f:
            f.write(b"half")
            raise KeyError("boom")
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_staging_publishes_all_or_nothing(tmp_path, caplog):
    (tmp_path / "a").write_bytes(b"old a")
    with Staging(tmp_path, "run") as stage:
        open(stage.path("a"), "wb").write(b"new a")
        os.makedirs(stage.path("dump"))
        open(os.path.join(stage.path("dump"), "x"), "w").write("x")
        assert _tree(tmp_path)["a"] == b"old a"  # nothing visible before publish
        stage.publish()
    assert _tree(tmp_path) == {"a": b"new a", "dump/x": b"x"}

    with pytest.raises(RuntimeError):
        with Staging(tmp_path, "run") as stage:
            open(stage.path("a"), "wb").write(b"newer a")
            raise RuntimeError("stage 3 failed")
    assert _tree(tmp_path) == {"a": b"new a", "dump/x": b"x"}
    assert set(os.listdir(tmp_path)) == {"a", "dump"}  # no staging directory left
    assert "run failed: its partial outputs in" in caplog.text and "were removed" in caplog.text


def test_staged_dir_replaces_a_folder_whole(tmp_path):
    folder = tmp_path / "result" / "model"
    folder.mkdir(parents=True)
    (folder / "stale.html").write_text("from an older run")
    with staged_dir(folder, "perf") as work:
        open(os.path.join(work, "model.html"), "w").write("new")
    assert os.listdir(folder) == ["model.html"]
    assert os.listdir(tmp_path / "result") == ["model"]


WRITER = textwrap.dedent(
    """
    import os, sys
    from bpuemu.common.atomic import Staging
    target, tag = sys.argv[1], sys.argv[2]
    with Staging(target, "run") as stage:
        for name in ("a", "b", "c"):
            with open(stage.path(name), "w") as f:
                f.write(tag + name)
        stage.publish()
    """
)


def _killed_at(point, target, tag):
    """Run WRITER until it stops itself at ``point``, then SIGKILL it."""
    env = dict(os.environ, BPUEMU_TEST_STOP_AT=point)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), tag], env=env)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), "the writer never reached " + point
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_run_killed_mid_publish_is_rolled_forward_by_the_next(tmp_path):
    subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "old"], check=True, timeout=60)
    _killed_at("run:publishing", tmp_path, "new")
    files = {k: v for k, v in _tree(tmp_path).items() if "/" not in k}
    assert files == {"a": b"newa", "b": b"oldb", "c": b"oldc"}  # the kill landed between two renames
    handled = recover_stale(tmp_path)
    assert len(handled) == 1
    assert _tree(tmp_path) == {"a": b"newa", "b": b"newb", "c": b"newc"}


def test_a_live_runs_staging_directory_is_left_alone(tmp_path):
    with Staging(tmp_path, "run") as live:
        open(live.path("a"), "w").write("x")
        assert recover_stale(tmp_path) == []
        assert os.path.isdir(live.dir)

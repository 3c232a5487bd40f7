"""The host/board split holds: checked statically (import-linter) and at run time.

import-linter (grimp) cannot see through the editable install's package-dir
mapping, so the static check runs on a copy of the tree laid out as the
installed package ``bpuemu/{common,board,host}``.
"""
import pathlib
import shutil
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_import_contracts(tmp_path):
    pkg = tmp_path / "bpuemu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for part in ("common", "board", "host"):
        shutil.copytree(ROOT / part, pkg / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
                          cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout


BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = ("bpuemu.host", "onnx", "paramiko", "yaml")
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{name} is host-only and must not be imported on the board")
    sys.meta_path.insert(0, Block())
    """
)


def test_board_runs_without_host_packages(tmp_path):
    """With onnx, paramiko, yaml and bpuemu.host unimportable, the board still works end to end."""
    from bpuemu.host.samples import sample_bin

    model = tmp_path / "m.bin"
    sample_bin(str(model), height=16, width=16)
    script = BLOCKER + textwrap.dedent(
        f"""
        import bpuemu.board.daemon.server, bpuemu.board.daemon.cli, bpuemu.board.client, bpuemu.board.backends
        from bpuemu.board.hrt_model_exec.cli import cli
        from click.testing import CliRunner
        r = CliRunner().invoke(cli, ["infer", "--model_file", {str(model)!r}])
        assert r.exit_code == 0, r.output
        assert "infer success" in r.output
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "paramiko", "yaml") or m.startswith("bpuemu.host"))
        print("HOST-MODULES:", loaded)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HOST-MODULES: []" in proc.stdout


def test_blocker_really_blocks():
    """The test above would notice an import: the blocker raises for host modules."""
    proc = subprocess.run([sys.executable, "-c", BLOCKER + "import bpuemu.host.samples"], capture_output=True, text=True)
    assert proc.returncode != 0 and "host-only" in proc.stderr

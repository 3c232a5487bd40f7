"""The documentation site builds, and its getting-started page's commands run as written.

* ``mkdocs build --strict`` (mkdocs.yml): a broken link or anchor, a page missing from the nav, or a
  command whose click definition mkdocs-click cannot render fails the build.
* Every shell line of docs/getting-started.md's code blocks runs, as written, in a fresh copy of the
  checkout (its own .venv, as on a fresh clone), except ``scripts/test.sh``: that is the command
  running this test (CI's .ci/run), which cannot run itself.
"""
import os
import shutil
import subprocess
import sys

import pytest

from helpers.docs import ROOT, shell_lines
from helpers.installed import require

#: Lines of the getting-started page this test does not run, and why.
NOT_RUN_HERE = {"scripts/test.sh": "the whole suite: the command that runs this test"}


def test_the_site_builds_strict(tmp_path):
    try:
        import mkdocs  # noqa: F401  -- the [docs] extra, in [test]
    except ImportError:
        require("mkdocs is not installed (pip install -e '.[docs]')")   # a skip; a failure under CI
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the command reference is rendered from the click definitions, not left as a directive
    page = (tmp_path / "site" / "reference" / "hrt_model_exec" / "index.html").read_text()
    assert "--frame_count" in page and "::: mkdocs-click" not in page


def getting_started_lines():
    return list(shell_lines((ROOT / "docs" / "getting-started.md").read_text()))


def test_getting_started_has_the_two_commands():
    lines = [line.split("#")[0].strip() for line in getting_started_lines()]
    assert "scripts/demo.sh" in lines and "scripts/test.sh" in lines, lines


def _fresh_copy(dst):
    """The checkout as a fresh clone has it: no venv, no build output, no caches."""
    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", "dist", "*.egg-info", "site",
                                    ".pytest_cache", ".hypothesis")
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    return dst


@pytest.mark.timeout(1200)
def test_getting_started_lines_run_as_written(tmp_path):
    clone = _fresh_copy(tmp_path / "bpuemu")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT / ".venv")) and not p.startswith(sys.prefix))
    ran = []
    for line in getting_started_lines():
        command = line.split("#")[0].strip()
        if command in NOT_RUN_HERE:
            continue
        proc = subprocess.run(["bash", "-c", command], cwd=clone, capture_output=True, text=True, env=env,
                              timeout=1100)
        assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-3000:])
        ran.append(command)
        if command == "scripts/demo.sh":
            # the demo's last step: the board computes what the x86 simulator computes, bit for bit
            assert "Strict check PASSED" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert "scripts/demo.sh" in ran

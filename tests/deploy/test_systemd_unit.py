"""deploy/board/hrt_boardd.service: a unit systemd accepts, hardened, whose command line really runs.

systemd-analyze (Debian's systemd package) checks the unit offline: `verify`
for unknown keys and bad values, `security --offline` for the exposure score.
The ExecStart line is expanded the way systemd expands it, with the settings
install.sh writes, and run here against a real daemon on loopback.
"""
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

from deploy_helpers import INSTALL_SH, UNIT, expand_exec, free_port, parse_unit
from helpers.installed import require

#: Highest acceptable `systemd-analyze security` exposure, in its 0-100 scale (2.0 shown as "OK").
MAX_EXPOSURE = 20
VENV_HRT_BOARDD = "/opt/bpuemu/venv/bin/hrt_boardd"


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    require(None if exe else "systemd-analyze is not installed (scripts/test.sh installs Debian's systemd)")
    return exe


def unit():
    return parse_unit(UNIT.read_text())


def verify(tmp_path, text: str) -> subprocess.CompletedProcess:
    # The unit's binary lives in the board's venv, absent here: verify a copy pointing at /bin/true.
    path = tmp_path / "hrt_boardd.service"
    path.write_text(text.replace(VENV_HRT_BOARDD, "/bin/true"))
    return subprocess.run([systemd_analyze(), "verify", "--man=no", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_systemd_accepts_every_line(tmp_path):
    proc = verify(tmp_path, UNIT.read_text())
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def test_verify_would_catch_a_bad_line(tmp_path):
    text = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=sometimes\nProtectEverything=yes")
    out = verify(tmp_path, text)
    assert "Unknown key 'ProtectEverything'" in out.stderr and "sometimes" in out.stderr, out.stderr


def test_exposure_is_low(tmp_path):
    proc = subprocess.run([systemd_analyze(), "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}", str(UNIT)],
                          capture_output=True, text=True, timeout=60)
    level = re.search(r"Overall exposure level for hrt_boardd.service: ([0-9.]+)", proc.stdout)
    assert level, proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exposure {level.group(1)} is over {MAX_EXPOSURE / 10}:\n{proc.stdout}"
    weak = tmp_path / "weak.service"
    weak.write_text("[Service]\nExecStart=/bin/true\n")
    assert subprocess.run([systemd_analyze(), "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}", str(weak)],
                          capture_output=True, text=True, timeout=60).returncode != 0, "the threshold must bite"


def test_hardening_and_restart_policy():
    service = unit()["Service"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["User"] not in ("root", "0") and one["Group"] not in ("root", "0")
    assert one["NoNewPrivileges"] == "yes"
    assert one["ProtectSystem"] == "strict"
    writable = " ".join(service["ReadWritePaths"]).split()
    assert {"-/var/lib/bpuemu", "-/userdata/bpuemu"} <= set(writable), writable
    assert one["Restart"] == "on-failure"
    assert one["EnvironmentFile"] == "/etc/bpuemu/hrt_boardd.conf"
    assert one["CapabilityBoundingSet"] == "" and one["PrivateTmp"] == "yes" and one["ProtectHome"] == "yes"
    assert unit()["Install"]["WantedBy"] == ["multi-user.target"]


def install_sh_settings():
    """The KEY=VALUE settings install.sh writes into a fresh hrt_boardd.conf."""
    text = INSTALL_SH.read_text()
    block = text[text.index('cat >"$tmp" <<EOF'):]
    block = block[: block.index("\nEOF\n")]
    return re.findall(r"^(HRT_BOARDD_[A-Z_]+)=", block, flags=re.M)


def test_exec_start_uses_exactly_the_settings_install_sh_writes():
    (exec_start,) = unit()["Service"]["ExecStart"]
    used = set(re.findall(r"\$\{?(HRT_BOARDD_[A-Z_]+)\}?", exec_start))
    assert used == set(install_sh_settings())
    assert exec_start.split()[0] == VENV_HRT_BOARDD


def test_exec_start_runs(tmp_path):
    """ExecStart, expanded as systemd does with settings like install.sh's, starts a daemon that serves and stops."""
    token_file = tmp_path / "token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    port = free_port()
    env = {"HRT_BOARDD_LISTEN": f"127.0.0.1:{port}", "HRT_BOARDD_TOKEN_FILE": str(token_file),
           "HRT_BOARDD_MODEL_DIR": str(tmp_path / "models"), "HRT_BOARDD_MAX_MODEL_MB": "64",
           "HRT_BOARDD_MAX_JOBS": "2", "HRT_BOARDD_MAX_FRAME_COUNT": "1000", "HRT_BOARDD_MAX_PERF_TIME": "1",
           "HRT_BOARDD_LOG_LEVEL": "INFO", "HRT_BOARDD_EXTRA_ARGS": "--max-uploads 2  --no-data-channel"}
    assert set(env) == set(install_sh_settings())
    (exec_start,) = unit()["Service"]["ExecStart"]
    argv = expand_exec(exec_start, env)
    assert argv[-3:] == ["--max-uploads", "2", "--no-data-channel"], "$HRT_BOARDD_EXTRA_ARGS splits into words"
    argv[0] = os.path.join(os.path.dirname(sys.executable), "hrt_boardd")
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if not k.startswith("BPUEMU_")})
    try:
        probe = [sys.executable, "-m", "bpuemu.board.daemon.healthcheck", "--target", f"127.0.0.1:{port}", "-q"]
        deadline = time.monotonic() + 60
        while subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()

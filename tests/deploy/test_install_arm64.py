"""The board install, for real, on arm64 Debian under qemu-user, driven from this x86 host.

deploy/board/arm64_chroot.sh builds (once; cached) an arm64 bookworm root,
run by qemu-user through binfmt_misc, and gives this module a session of its
own: a fresh board (an overlay of the cached root, which stays pristine). Into
it, deploy/board/install.sh installs the bpuemu wheel built from this tree,
with its board dependencies from their aarch64 wheels (PyPI) (--no-systemd:
there is no systemd in a chroot). The daemon is then started exactly as the
installed hrt_boardd.service would start it (its ExecStart, its
EnvironmentFile, its User), listening on 127.0.0.1 (the chroot shares this
host's network), and the host's own tools run against it: hrt_model_exec
model_info|infer|perf --board and hb_verifier's three-way compare ("Arm VS
Sim"). Outputs are compared with the in-process x86 runtime tensor by tensor.

Needs root and Debian's qemu-user-static, binfmt-support and debootstrap
(scripts/test.sh installs them). Elsewhere the module skips, except under CI,
where not running it is a failure. Timing (cold chroot build, install) is
printed; run with -s to see it.
"""
import fcntl
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient
from bpuemu.common.errors import Unauthenticated
from bpuemu.common.input_types import random_rt_input
from bpuemu.common.version import __version__

from helpers.installed import require
from deploy_helpers import ARM64_CHROOT, INSTALL_SH, REPO, UNIT, expand_exec, free_port, parse_env_file, parse_unit

pytestmark = pytest.mark.timeout(1800)

CHROOT_BUILD_TIMEOUT_S = 1500
INSTALL_TIMEOUT_S = 900
DAEMON_START_TIMEOUT_S = 180
EM_AARCH64 = 183  # ELF e_machine
#: The sample's float Softmax tail runs onnxruntime's CPU kernel, whose exp differs by CPU
#: (AVX2 vs NEON): measured 1-2 ULP. Every integer tensor must still be bit-identical.
MAX_FLOAT_TAIL_ULP = 4
HOST_ONLY_DISTS = ("onnx", "paramiko", "pyyaml", "matplotlib", "pillow", "schema", "numba", "llvmlite")
INSTALL_DIR = "/tmp/bpuemu-install"

TIMES: Dict[str, float] = {}


def chroot_script(*args, timeout, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(ARM64_CHROOT), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"arm64_chroot.sh {' '.join(args[:3])} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="module")
def root():
    """A fresh arm64 board for this module: a session over the cached root (built first when missing)."""
    t0 = time.monotonic()
    proc = chroot_script("build", timeout=CHROOT_BUILD_TIMEOUT_S, check=False)
    if proc.returncode == 77:
        require(f"no arm64 chroot here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    TIMES["chroot_build_s"] = time.monotonic() - t0
    cache = pathlib.Path(proc.stdout.strip().splitlines()[-1])
    with open(f"{cache}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # a rebuild of the cache waits for this session
        assert (cache / ".bpuemu-chroot-stamp").is_file()
        # Sessions of test runs that died without ending them.
        for stale in (cache.parent / "sessions").glob("pytest-*"):
            if not _alive(int(stale.name.split("-")[1])):
                chroot_script("end", str(stale), timeout=120)
        session = chroot_script("session", f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}", timeout=120)
        path = pathlib.Path(session.stdout.strip().splitlines()[-1])
        try:
            yield path
        finally:
            chroot_script("end", str(path), timeout=120)


def in_root(root: pathlib.Path, path: str) -> pathlib.Path:
    return root / path.lstrip("/")


def build_wheel(out_dir: pathlib.Path) -> pathlib.Path:
    """The bpuemu wheel of this tree, built from a copy (nothing is written into the checkout)."""
    src = out_dir / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for part in ("common", "board", "host"):
        shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out_dir), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out_dir.glob("bpuemu-*.whl")
    return wheel


@dataclass
class Installed:
    root: pathlib.Path
    port: int
    wheel: str  # path inside the root
    log: str
    seconds: float
    passwd: Dict[str, list] = field(default_factory=dict)

    def path(self, p: str) -> pathlib.Path:
        return in_root(self.root, p)

    @property
    def conf(self) -> Dict[str, str]:
        return parse_env_file(self.path("/etc/bpuemu/hrt_boardd.conf").read_text())


def run_install(root, *args, timeout=INSTALL_TIMEOUT_S):
    return chroot_script("run", str(root), "/bin/bash", f"{INSTALL_DIR}/install.sh", *args, timeout=timeout, check=False)


def read_passwd(root) -> Dict[str, list]:
    return {f[0]: f for f in (line.split(":") for line in in_root(root, "/etc/passwd").read_text().splitlines())}


@pytest.fixture(scope="module")
def installed(root, tmp_path_factory):
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    assert "bpuemu" not in read_passwd(root), "the session must start from a pristine board"
    assert not in_root(root, "/opt/bpuemu").exists()
    staging = in_root(root, INSTALL_DIR)
    staging.mkdir()
    for f in (INSTALL_SH, UNIT, wheel):
        shutil.copy(f, staging / f.name)
    port = free_port()
    t0 = time.monotonic()
    proc = run_install(root, "--no-systemd", "--listen", f"127.0.0.1:{port}", "--max-jobs", "2",
                       f"{INSTALL_DIR}/{wheel.name}")
    seconds = time.monotonic() - t0
    TIMES["install_fresh_s"] = seconds
    assert proc.returncode == 0, f"install.sh failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return Installed(root, port, f"{INSTALL_DIR}/{wheel.name}", proc.stdout + proc.stderr, seconds, read_passwd(root))


def elf_machine(path: pathlib.Path) -> int:
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", path
    return int.from_bytes(head[18:20], "little")


def site_packages(inst: Installed) -> pathlib.Path:
    (sp,) = inst.path("/opt/bpuemu/venv/lib").glob("python3*/site-packages")
    return sp


def test_install_lays_out_the_board(installed):
    inst = installed
    out = inst.log
    for line in ("created system user bpuemu", "wrote /etc/bpuemu/hrt_boardd.conf", "generated a new token",
                 "created the venv /opt/bpuemu/venv", "installed: hrt_boardd, version " + __version__):
        assert line in out, f"{line!r} not in:\n{out[-3000:]}"
    user = inst.passwd["bpuemu"]
    uid, gid = int(user[2]), int(user[3])
    assert 0 < uid < 1000 and user[6] == "/usr/sbin/nologin", user

    conf = inst.conf
    assert conf["HRT_BOARDD_LISTEN"] == f"127.0.0.1:{inst.port}"
    assert conf["HRT_BOARDD_MAX_JOBS"] == "2"
    assert conf["HRT_BOARDD_MODEL_DIR"] == "/var/lib/bpuemu/models"  # no /userdata in this root
    assert conf["HRT_BOARDD_TOKEN_FILE"] == "/etc/bpuemu/token"
    st = inst.path("/etc/bpuemu/hrt_boardd.conf").stat()
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 0, gid)

    token_path = inst.path(conf["HRT_BOARDD_TOKEN_FILE"])
    st = token_path.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, uid)
    assert re.fullmatch(r"[0-9a-f]{64}", token_path.read_text())

    st = inst.path(conf["HRT_BOARDD_MODEL_DIR"]).stat()
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o750, uid, gid)

    assert inst.path("/etc/systemd/system/hrt_boardd.service").read_bytes() == UNIT.read_bytes()
    assert not inst.path("/etc/systemd/system/hrt_boardd.service.d").exists(), "default settings need no drop-in"
    assert os.readlink(inst.path("/usr/local/bin/hrt_model_exec")) == "/opt/bpuemu/venv/bin/hrt_model_exec"


def test_board_dependencies_are_aarch64_wheels_and_nothing_from_the_host(installed):
    sp = site_packages(installed)
    dists = {re.sub(r"-[^-]+\.dist-info$", "", d.name).lower().replace("_", "-"): d for d in sp.glob("*.dist-info")}
    for name in ("bpuemu", "numpy", "onnxruntime", "grpcio", "grpcio-health-checking", "protobuf", "click", "tqdm"):
        assert name in dists, f"{name} not installed: {sorted(dists)}"
    for name in ("numpy", "onnxruntime", "grpcio"):
        tags = (dists[name] / "WHEEL").read_text()
        assert "aarch64" in tags, f"{name}: {tags}"
    for lib in ("onnxruntime/capi/onnxruntime_pybind11_state*.so", "numpy/_core/_multiarray_umath*.so",
                "grpc/_cython/cygrpc*.so"):
        (so,) = sp.glob(lib)
        assert elf_machine(so) == EM_AARCH64, so
    assert not set(HOST_ONLY_DISTS) & set(dists), sorted(set(HOST_ONLY_DISTS) & set(dists))


def test_install_again_keeps_token_and_settings(installed):
    inst = installed
    token = inst.path("/etc/bpuemu/token").read_bytes()
    conf_before = inst.path("/etc/bpuemu/hrt_boardd.conf").read_text().splitlines()
    t0 = time.monotonic()
    proc = run_install(inst.root, "--no-systemd", "--max-frame-count", "5000", inst.wheel)
    TIMES["install_again_s"] = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "kept the settings" in out and "set HRT_BOARDD_MAX_FRAME_COUNT=5000" in out, out
    assert "generated a new token" not in out and "created" not in out, out
    assert "Successfully installed bpuemu-" in out, "a same-version artifact must still replace the installed code"
    assert inst.path("/etc/bpuemu/token").read_bytes() == token
    conf_after = inst.path("/etc/bpuemu/hrt_boardd.conf").read_text().splitlines()
    changed = [(a, b) for a, b in zip(conf_before, conf_after) if a != b]
    assert len(conf_before) == len(conf_after) and changed == [("HRT_BOARDD_MAX_FRAME_COUNT=1000000",
                                                                 "HRT_BOARDD_MAX_FRAME_COUNT=5000")], changed


def test_install_refuses_bad_settings(installed):
    proc = run_install(installed.root, "--no-systemd", "--max-jobs", "0", installed.wheel, timeout=120)
    assert proc.returncode != 0
    assert "--max-jobs must be a positive integer" in proc.stderr, proc.stderr
    proc = run_install(installed.root, "--no-systemd", "--listen", "0.0.0.0:1 --evil", installed.wheel, timeout=120)
    assert proc.returncode != 0 and "cannot contain spaces" in proc.stderr, proc.stderr
    assert installed.conf["HRT_BOARDD_MAX_JOBS"] == "2"


# --- the daemon, started as the installed unit starts it ------------------------

@dataclass
class ArmDaemon:
    proc: subprocess.Popen
    target: str
    token_file: str
    token: str
    log_path: pathlib.Path
    uid: int
    startup_s: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def health(target: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bpuemu.board.daemon.healthcheck", "--target", target, "--timeout", "5"],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def arm_daemon(installed, tmp_path_factory):
    inst = installed
    unit = parse_unit(inst.path("/etc/systemd/system/hrt_boardd.service").read_text())["Service"]
    env_file = unit["EnvironmentFile"][-1]
    env = parse_env_file(inst.path(env_file).read_text())
    argv = expand_exec(unit["ExecStart"][-1], env)
    user, group = unit["User"][-1], unit["Group"][-1]
    home = inst.passwd[user][5]
    work = tmp_path_factory.mktemp("arm_daemon")
    token = inst.path(env["HRT_BOARDD_TOKEN_FILE"]).read_text().strip()
    token_file = work / "token"  # the copy a host keeps
    token_file.write_text(token)
    token_file.chmod(0o600)
    log_path = work / "hrt_boardd.log"
    # systemd gives a service its user's HOME/USER/LOGNAME and nothing else but the EnvironmentFile.
    command = ["bash", str(ARM64_CHROOT), "run", str(inst.root), "/usr/bin/env", f"HOME={home}", f"USER={user}", f"LOGNAME={user}",
               "setpriv", f"--reuid={user}", f"--regid={group}", "--init-groups", *argv]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    target = env["HRT_BOARDD_LISTEN"]
    daemon = ArmDaemon(proc, target, str(token_file), token, log_path, int(inst.passwd[user][2]), 0.0)
    try:
        while health(target).returncode != 0:
            assert proc.poll() is None, f"the aarch64 hrt_boardd exited with {proc.returncode}:\n{daemon.log()}"
            assert time.monotonic() - t0 < DAEMON_START_TIMEOUT_S, f"not healthy in {DAEMON_START_TIMEOUT_S}s:\n{daemon.log()}"
            time.sleep(0.5)
        daemon.startup_s = TIMES["daemon_start_s"] = time.monotonic() - t0
        yield daemon
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("\narm64 timings: " + json.dumps({k: round(v, 1) for k, v in TIMES.items()}))


def test_daemon_is_aarch64_runs_as_its_user_and_requires_the_token(arm_daemon):
    with BoardClient(arm_daemon.target, token=arm_daemon.token, client_name="deploy-tests") as board:
        info = board.info
    assert info.arch == "aarch64"
    assert info.daemon_version == __version__
    assert info.onnxruntime_version
    with open(f"/proc/{arm_daemon.proc.pid}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert {int(u) for u in uids} == {arm_daemon.uid}, uids
    with BoardClient(arm_daemon.target, token="", client_name="deploy-tests") as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.handshake()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from bpuemu.host.samples import sample_bin

    d = tmp_path_factory.mktemp("sample")
    sample_bin(str(d / "model.bin"), height=16, width=16, quantized_path=str(d / "quanti.onnx"))
    return d


def host_tool(tool: str, *args, cwd) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), tool)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPUEMU_")}
    return subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def test_hrt_model_exec_against_the_arm_board(arm_daemon, sample):
    board = ("--board", arm_daemon.target, "--token-file", arm_daemon.token_file)
    model = sample / "model.bin"
    info = host_tool("hrt_model_exec", "model_info", "--model_file", model, *board, cwd=sample)
    assert info.returncode == 0, info.stdout + info.stderr
    assert f"on board {arm_daemon.target} (aarch64, bpuemu {__version__})" in info.stdout + info.stderr
    assert "[model name]: sample_16x16_rgb" in info.stdout

    infer = host_tool("hrt_model_exec", "infer", "--model_file", model, *board, cwd=sample)
    assert infer.returncode == 0, infer.stdout + infer.stderr
    assert "infer success: model sample_16x16_rgb" in infer.stdout

    perf = host_tool("hrt_model_exec", "perf", "--model_file", model, "--frame_count", "4", "--thread_num", "2", *board,
                     cwd=sample)
    assert perf.returncode == 0, perf.stdout + perf.stderr
    assert re.search(r"Thread number is: 2", perf.stdout) and re.search(r"Frame count\s+is: 4", perf.stdout), perf.stdout
    assert re.search(r"Frame\s+rate\s+is: [0-9.]+ FPS", perf.stdout), perf.stdout


def test_hb_verifier_arm_vs_sim_passes(arm_daemon, sample):
    report = sample / "verify.json"
    proc = host_tool("hb_verifier", "-m", f"{sample / 'quanti.onnx'},{sample / 'model.bin'}", "-s", "True",
                     "-b", f"grpc://{arm_daemon.target}", "--token-file", arm_daemon.token_file, "--json", report, cwd=sample)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"Arm infer: board {arm_daemon.target} (aarch64" in out, out
    block = out[out.index("compare source: Arm VS Sim"):]
    assert "Arm and Sim result Strict check PASSED" in block, block
    assert "all 3 comparison(s) PASSED" in out
    data = json.loads(report.read_text())
    assert data["passed"] is True
    (arm,) = [s for s in data["sides"] if s["label"] == "Arm"]
    (sim,) = [s for s in data["sides"] if s["label"] == "Sim"]
    assert arm["platform"].startswith("aarch64"), arm
    assert sim["platform"].startswith(os.uname().machine), sim
    assert [p["source"] for p in data["pairs"]] == ["Quanti.onnx VS Arm", "Quanti.onnx VS Sim", "Arm VS Sim"]


def _models(tmp_path_factory, sample):
    from helpers import models  # tests/helpers (tests/ is on sys.path through its conftest.py)

    d = tmp_path_factory.mktemp("arm_models")
    built = {"sample_16x16 (float Softmax tail)": str(sample / "model.bin")}
    for name, make, per_channel in (("residual", models.residual_model, True), ("cpu_middle", models.cpu_middle_model, False)):
        built[f"{name} ({'per-channel' if per_channel else 'per-tensor'})"] = models.build_case(
            d, make(size=16), name, per_channel=per_channel).path
    return built


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    ia, ib = a.astype(np.float32).view(np.int32).astype(np.int64), b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.max(np.abs(ia - ib))) if ia.size else 0


def test_arm_board_matches_the_x86_runtime(arm_daemon, sample, tmp_path_factory):
    """Every tensor, bit for bit; the one exception is a float tail computed by a CPU op (within a few ULP)."""
    findings = []
    with BoardClient(arm_daemon.target, token=arm_daemon.token, client_name="deploy-tests") as board:
        for label, path in _models(tmp_path_factory, sample).items():
            with LocalBackend([path]) as local:
                handle = local.model()
                rng = np.random.default_rng(11)
                inputs = [[random_rt_input(s, rng) for s in handle.model.input_specs] for _ in range(3)]
                expected = [handle.infer(x, dump_intermediate=True) for x in inputs]
                cpu_float_outputs = {p.name for p in handle.model.outputs} if "Softmax tail" in label else set()
            sha = board.ensure_model(path)
            for x, want in zip(inputs, expected):
                got = board.infer(sha, "", x, dump_intermediate=True)
                assert list(got.outputs) == list(want.outputs)
                assert sorted(got.intermediates) == sorted(want.intermediates)
                tensors = {**{f"output {k}": (v, got.outputs[k]) for k, v in want.outputs.items()},
                           **{k: (v, got.intermediates[k]) for k, v in want.intermediates.items()}}
                for name, (w, g) in tensors.items():
                    assert w.dtype == g.dtype and w.shape == g.shape, (label, name)
                    if np.array_equal(w, g):
                        continue
                    bare = name.removeprefix("output ")
                    assert bare in cpu_float_outputs and w.dtype == np.float32, \
                        f"{label}: {name} ({w.dtype}) differs between aarch64 and x86"
                    ulp = ulp_distance(w, g)
                    assert ulp <= MAX_FLOAT_TAIL_ULP, f"{label}: {name} is {ulp} ULP off"
                    findings.append(f"{label}: {name} {ulp} ULP")
    print("\naarch64 vs x86 float-tail differences: " + ("; ".join(sorted(set(findings))) or "none"))


def test_sigterm_stops_the_arm_daemon(arm_daemon):
    proc = arm_daemon.proc
    assert proc.poll() is None, arm_daemon.log()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, arm_daemon.log()
    log = arm_daemon.log()
    assert "shutting down" in log and "Traceback" not in log, log
    after = health(arm_daemon.target)
    assert after.returncode == 1 and "UNAVAILABLE" in after.stderr, after.stdout + after.stderr


def test_install_with_userdata_another_user_and_config(installed):
    """A board with /userdata (as RDK boards have), a service user and settings file of its own: the store
    goes to /userdata, and a unit drop-in points systemd at that user and file; back to the defaults, the
    drop-in goes. Runs last: it reuses the venv and leaves the default settings alone."""
    inst = installed
    dropin = inst.path("/etc/systemd/system/hrt_boardd.service.d/10-install.conf")
    inst.path("/userdata").mkdir()
    proc = run_install(inst.root, "--no-systemd", "--config", "/etc/bpuemu-b/hrt_boardd.conf",
                       "--token-file", "/etc/bpuemu-b/token", "--user", "boardb", inst.wheel)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    conf = parse_env_file(inst.path("/etc/bpuemu-b/hrt_boardd.conf").read_text())
    assert conf["HRT_BOARDD_MODEL_DIR"] == "/userdata/bpuemu/models"
    assert conf["HRT_BOARDD_LISTEN"] == "0.0.0.0:9473"  # the board default: reached from the host, with the token
    boardb = int(read_passwd(inst.root)["boardb"][2])
    for path, mode in (("/userdata/bpuemu/models", 0o750), ("/etc/bpuemu-b/token", 0o600)):
        st = inst.path(path).stat()
        assert (st.st_uid, st.st_mode & 0o777) == (boardb, mode), path
    assert read_passwd(inst.root)["boardb"][5] == "/var/lib/boardb"
    text = dropin.read_text()
    assert "User=boardb" in text and "EnvironmentFile=\nEnvironmentFile=/etc/bpuemu-b/hrt_boardd.conf" in text, text
    # Its own HOME becomes writable; the store needs nothing (the unit allows /userdata/bpuemu already).
    assert re.findall(r"^ReadWritePaths=.*$", text, flags=re.M) == ["ReadWritePaths=-/var/lib/boardb"], text
    # The default install is untouched: its settings, and its state dir still the bpuemu user's.
    assert inst.conf["HRT_BOARDD_MODEL_DIR"] == "/var/lib/bpuemu/models"
    assert inst.path("/var/lib/bpuemu").stat().st_uid == int(inst.passwd["bpuemu"][2])

    proc = run_install(inst.root, "--no-systemd", inst.wheel)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not dropin.exists() and not dropin.parent.exists()


def test_chroot_script_guards(root):
    """The cached root is never written to, and "cannot run here" is exit 77 (what the fixture skips on)."""
    cache = chroot_script("path", timeout=30).stdout.strip()
    proc = chroot_script("run", cache, "/bin/true", timeout=60, check=False)
    assert proc.returncode == 1 and "stays pristine" in proc.stderr, proc.stderr
    assert in_root(root, "/etc/hostname").exists() and root != pathlib.Path(cache)
    nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash", str(ARM64_CHROOT),
                             "build"], capture_output=True, text=True, timeout=60)
    assert nobody.returncode == 77 and "needs root" in nobody.stderr, nobody.stderr

"""The SSH board transport against a real OpenSSH sshd on loopback.

The "board" is this machine reached through sshd; its hrt_model_exec is
``python -m bpuemu.board.cli.hrt_model_exec``. Checked: results bit-identical to
the local runtime (outputs and intermediate dumps), hrt_model_exec
model_info/infer/perf --ssh, host key checking, and one clear error for each
failure: authentication, unreachable board, unknown or changed host key, no
hrt_model_exec on the board, the board dying mid-run, a command past its
deadline, and the SSH plugin missing from a board-only install.
"""
import os
import shutil
import stat
import subprocess
import re
import sys
import textwrap

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend, TransportRequest, load_transport
from bpuemu.board.connect import open_backend
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.common.errors import (
    BoardUnavailable, DeadlineExceeded, IncompatibleVersion, NotFound, PermissionDenied, Unauthenticated,
)
from bpuemu.common.input_types import random_rt_input
from bpuemu.common.exec_json import read_document
from bpuemu.common.version import EXEC_JSON_VERSION
from bpuemu.host.clients.ssh import SshBackend, parse_target

from sshd_harness import REMOTE_COMMAND, Sshd, assert_ok, assert_one_error, run_cli

SIZE = 32
#: What hrt_model_exec infer prints on stderr besides errors when it makes random inputs.
RANDOM_NOTE = r"^no --input_file given"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """input_type_rt -> path of a 32x32 sample .bin."""
    from bpuemu.host.samples import sample_bin

    d = tmp_path_factory.mktemp("ssh_models")
    out = {}
    for kind in ("rgb", "nv12", "featuremap"):
        out[kind] = str(d / f"{kind}.bin")
        sample_bin(out[kind], input_type_rt=kind, height=SIZE, width=SIZE)
    return out


def options(sshd, tmp_path, **kw) -> TransportRequest:
    """What hrt_model_exec --ssh hands the ssh transport plugin."""
    base = dict(identity=sshd.user_key, known_hosts=sshd.known_hosts, remote_command=REMOTE_COMMAND,
                remote_tmp=str(tmp_path), connect_timeout_s=10.0, command_timeout_s=60.0)
    base.update(kw)
    return TransportRequest("ssh", sshd.target, base)


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- results --------------------------------------------------------------------

def test_infer_matches_the_local_runtime_bit_for_bit(sshd, models, tmp_path):
    """rgb, nv12 and featuremap models in one session: outputs and every dumped tensor equal the local runtime's."""
    files = [models[k] for k in ("rgb", "nv12", "featuremap")]
    expected, inputs = {}, {}
    with LocalBackend(files) as local:
        for i, name in enumerate(local.model_names):
            h = local.model(name)
            inputs[name] = random_rt_input(h.model.input_specs[0], np.random.default_rng(7 + i))
            expected[name] = h.infer([inputs[name]], dump_intermediate=True)
    seen = []
    with open_backend(files, ssh=options(sshd, tmp_path)) as board:
        assert isinstance(board, SshBackend)  # found through the bpuemu.transports entry point
        assert board.model_names == list(expected)
        work = board.work_dir
        assert os.path.isdir(work) and os.path.dirname(work) == str(tmp_path)
        assert stat.S_IMODE(os.stat(work).st_mode) == 0o700
        got = {name: board.model(name).infer([inputs[name]], dump_intermediate=True) for name in expected}
        # Each call's inputs and dumps are gone; the uploaded models stay until close.
        assert sorted(f for f in os.listdir(work) if f != ".owner") == sorted(f"{i}_{os.path.basename(f)}" for i, f in enumerate(files))
        report = board.model("sample_32x32_featuremap").perf(PerfConfig(frame_count=5), [inputs["sample_32x32_featuremap"]],
                                                             progress=lambda done, total, t: seen.append((done, total)))
        assert board.platform.arch and board.platform.onnxruntime_version != "unknown"
        assert "over SSH" in board.description and board.load_ms > 0
    assert not os.path.exists(work), "the work dir must be removed on close"
    assert report.frame_count == 5 and report.fps > 0 and seen == [(5, 5)]
    for name, exp in expected.items():
        res = got[name]
        assert list(res.outputs) == list(exp.outputs)
        for t, arr in exp.outputs.items():
            assert res.outputs[t].dtype == arr.dtype and np.array_equal(res.outputs[t], arr), (name, t)
        assert set(res.intermediates) == set(exp.intermediates) and len(exp.intermediates) >= 3
        for t, arr in exp.intermediates.items():
            assert res.intermediates[t].dtype == arr.dtype and np.array_equal(res.intermediates[t], arr), (name, t)
        assert len(res.latency_ms) == 1 and res.latency_ms[0] > 0


def test_hrt_model_exec_infer_over_ssh_is_identical_to_local(sshd, models, tmp_path):
    model = models["nv12"]
    outs = {}
    for where, extra in (("local", []), ("ssh", sshd.cli_args())):
        cwd = tmp_path / where
        cwd.mkdir()
        before = sshd.work_dirs()
        result = run_cli(["infer", "--model_file", model, "--enable_dump", "true", "--dump_format", "txt",
                          "--dump_intermediate", "1", *extra], cwd)
        assert_ok(result)
        assert not sshd.work_dirs() - before, "a work dir was left on the board"
        outs[where] = result
    def strip(where):  # latency differs run to run, and each run dumps into its own cwd
        text = outs[where].stdout.replace(str(tmp_path / where), "CWD")
        return [line for line in text.splitlines() if "latency" not in line]

    assert strip("ssh") == strip("local")
    assert "infer success" in outs["ssh"].stdout and "top5" in outs["ssh"].stdout
    local_files = sorted(os.listdir(tmp_path / "local"))
    assert local_files == sorted(os.listdir(tmp_path / "ssh")) and len(local_files) > 3
    for name in local_files:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ssh" / name).read_bytes(), name


def test_model_info_over_ssh(sshd, models, tmp_path):
    local = run_cli(["model_info", "--model_file", models["rgb"]], tmp_path)
    remote = run_cli(["model_info", "--model_file", models["rgb"], *sshd.cli_args()], tmp_path)
    assert_ok(local)
    assert_ok(remote)
    first = remote.stdout.splitlines()[0]
    assert first.startswith(f"Load model on board {sshd.target} over SSH (") and "onnxruntime" in first, first
    assert remote.stdout.splitlines()[1:] == local.stdout.splitlines()[1:]


def test_perf_over_ssh_fetches_the_profiler_files(sshd, models, tmp_path):
    prof = tmp_path / "prof"
    result = run_cli(["perf", "--model_file", models["rgb"], "--frame_count", "20", "--thread_num", "2",
                      "--profile_path", str(prof), "--json", *sshd.cli_args()], tmp_path)
    assert_ok(result)
    doc = read_document(result.stdout, "perf")
    report = doc["result"]
    assert report["thread_num"] == 2 and doc["profiler_files"] == ["profiler.log", "profiler.csv"]
    assert report["frame_count"] == 20 and report["fps"] > 0 and report["p99_ms"] >= report["p50_ms"] > 0
    csv = (prof / "profiler.csv").read_text()
    assert "BPU_sample_32x32_rgb_subgraph_0" in csv
    assert "***" in (prof / "profiler.log").read_text()


# --- host keys ------------------------------------------------------------------

def test_unknown_host_key_is_refused_until_accepted(sshd, models, tmp_path, caplog):
    known = tmp_path / "nested" / "known_hosts"  # does not exist yet
    args = ["model_info", "--model_file", models["rgb"], *sshd.cli_args(known_hosts=str(known))]
    line = assert_one_error(run_cli(args, tmp_path), "host key", "not in", str(known))
    assert "SHA256:" in line
    assert not known.exists()
    with pytest.raises(PermissionDenied, match="not in"):
        open_backend([models["rgb"]], ssh=options(sshd, tmp_path, known_hosts=str(known)))
    with open_backend([models["rgb"]], ssh=options(sshd, tmp_path, known_hosts=str(known), accept_new_host_key=True)):
        pass
    assert "Permanently added" in caplog.text
    assert known.read_text().strip() == sshd.known_hosts_line()
    with open_backend([models["rgb"]], ssh=options(sshd, tmp_path, known_hosts=str(known))):
        pass  # now known: no flag needed


def test_a_recorded_host_key_is_a_warning_the_user_sees(sshd, models, tmp_path):
    """The SSH transport's warning reaches hrt_model_exec's user through the one logging setup (seed format)."""
    known = tmp_path / "known_hosts"
    args = ["model_info", "--model_file", models["rgb"], *sshd.cli_args(known_hosts=str(known)), "--accept-new-host-key"]
    result = run_cli(args, tmp_path)
    assert_ok(result)
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "Permanently added" in warnings[0] and str(known) in warnings[0], result.stderr
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING ", warnings[0])


def test_a_refused_login_hints_in_hrt_model_exec_flags(sshd, models, tmp_path):
    args = ["model_info", "--model_file", models["rgb"], *sshd.cli_args(identity=sshd.other_key)]
    assert_one_error(run_cli(args, tmp_path), "refused SSH authentication")
    assert run_cli(args, tmp_path).stderr.splitlines()[-1] == \
        "Hint: check the user (USER@ in --ssh), the password (-p) or the key (--identity)"


def test_changed_host_key_is_refused_even_with_accept_new(sshd, models, tmp_path):
    from sshd_harness import keygen

    impostor = keygen(str(tmp_path / "impostor"))
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line(impostor) + "\n")
    args = ["model_info", "--model_file", models["rgb"], *sshd.cli_args(known_hosts=str(known)), "--accept-new-host-key"]
    assert_one_error(run_cli(args, tmp_path), "HOST KEY MISMATCH")
    assert known.read_text().strip() == sshd.known_hosts_line(impostor)  # not overwritten


# --- failures: one clear error each -----------------------------------------------

def test_wrong_password_is_an_authentication_error(sshd, models, tmp_path):
    args = ["infer", "--model_file", models["rgb"], "--ssh", sshd.target, "-p", "not-the-password",
            "--known-hosts", sshd.known_hosts, "--remote-command", REMOTE_COMMAND]
    assert_one_error(run_cli(args, tmp_path), "refused SSH authentication", "password", ignore=RANDOM_NOTE)


def test_unauthorized_key_is_an_authentication_error(sshd, models, tmp_path):
    with pytest.raises(Unauthenticated, match="refused SSH authentication with key"):
        open_backend([models["rgb"]], ssh=options(sshd, tmp_path, identity=sshd.other_key))
    assert os.listdir(tmp_path) == []


def test_unreachable_board(models, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["infer", "--model_file", models["rgb"], "--ssh", f"root@127.0.0.1:{port}", "-p", "x"]
    assert_one_error(run_cli(args, tmp_path), "unreachable", f"127.0.0.1:{port}", ignore=RANDOM_NOTE)


def test_board_without_hrt_model_exec(sshd, models, tmp_path):
    args = ["infer", "--model_file", models["rgb"], *sshd.cli_args()]
    args[args.index(REMOTE_COMMAND)] = "hrt_model_exec_is_not_installed_here"
    before = sshd.work_dirs()
    assert_one_error(run_cli(args, tmp_path), "lacks hrt_model_exec", "hrt_model_exec_is_not_installed_here",
                     ignore=RANDOM_NOTE)
    assert not sshd.work_dirs() - before  # cleaned up after the failure too (earlier dead sessions' may go too)


def test_board_dying_mid_run(sshd, models, tmp_path):
    # The board-side command kills its own SSH session, as a crashing board drops the connection.
    die = script(tmp_path, "dying_board.sh", """\
        p=$$
        while [ "$p" -gt 1 ]; do
            p=$(awk '{print $4}' /proc/$p/stat)
            if [ "$(cat /proc/$p/comm)" = "sshd" ]; then kill -KILL "$p"; exit 0; fi
        done
        exit 3
        """)
    args = ["infer", "--model_file", models["rgb"], *sshd.cli_args()]
    args[args.index(REMOTE_COMMAND)] = die
    before = sshd.work_dirs()
    assert_one_error(run_cli(args, tmp_path), "lost during infer", ignore=RANDOM_NOTE)
    for leftover in sshd.work_dirs() - before:  # a dead board cannot clean up; we can, it is loopback
        shutil.rmtree(leftover, ignore_errors=True)  # (or the next session removes it)
    assert sshd.proc.poll() is None, "only the session died, not sshd"


def test_remote_process_killed_is_reported(sshd, models, tmp_path):
    killed = script(tmp_path, "killed.sh", "kill -KILL $$\n")
    with open_backend([models["rgb"]], ssh=options(sshd, tmp_path, remote_command=killed)) as board:
        with pytest.raises(BoardUnavailable, match="died during infer"):
            board.model().infer([])


def test_every_command_has_a_deadline(sshd, models, tmp_path):
    slow = script(tmp_path, "slow.sh", "sleep 30\n")
    with open_backend([models["rgb"]], ssh=options(sshd, tmp_path, remote_command=slow, command_timeout_s=1.0)) as board:
        with pytest.raises(DeadlineExceeded, match="infer on board .* did not finish within 1 s"):
            board.model().infer([])
    assert not any(p.name.startswith("bpuemu-ssh-") for p in tmp_path.iterdir())


def test_board_writing_a_newer_json_version_is_refused(sshd, models, tmp_path):
    newer = script(tmp_path, "newer.sh", f"""\
        {REMOTE_COMMAND} "$@" | sed 's/"version":{EXEC_JSON_VERSION},/"version":{EXEC_JSON_VERSION + 1},/'
        """)
    with open_backend([models["rgb"]], ssh=options(sshd, tmp_path, remote_command=newer)) as board:
        with pytest.raises(IncompatibleVersion, match=f"writes --json version {EXEC_JSON_VERSION + 1}; this side reads"):
            board.model().infer([])


def test_remote_errors_are_relayed(sshd, models, tmp_path):
    short = tmp_path / "short.bin"
    short.write_bytes(b"\x00" * 100)
    args = ["infer", "--model_file", models["rgb"], "--input_file", str(short), *sshd.cli_args()]
    line = assert_one_error(run_cli(args, tmp_path), f"board {sshd.target}", "needs 3072 bytes")
    assert line.count("ERROR") == 1


def test_missing_files_fail_before_connecting(tmp_path):
    with pytest.raises(NotFound, match="model file not found"):
        open_backend([str(tmp_path / "nope.bin")], ssh=TransportRequest("ssh", "root@192.0.2.1"))


def test_identity_file_must_exist(sshd, models, tmp_path):
    with pytest.raises(NotFound, match="identity file not found"):
        open_backend([models["rgb"]], ssh=options(sshd, tmp_path, identity=str(tmp_path / "no_key")))


# --- addresses and the plugin -------------------------------------------------------

def test_parse_target():
    assert str(parse_target("board")) == "root@board:22"
    assert str(parse_target("me@10.0.0.2:2222")) == "me@10.0.0.2:2222"
    assert str(parse_target("me@[::1]:2200")) == "me@[::1]:2200"
    assert str(parse_target("me@board", user="other")) == "other@board:22"
    with pytest.raises(Exception, match="port 'x' is not a number"):
        parse_target("board:x")


def test_ssh_transport_is_the_registered_plugin():
    assert load_transport("ssh") is SshBackend


def test_board_only_install_gives_one_line_for_ssh(models, tmp_path):
    """With bpuemu.host and paramiko unimportable (a board install), --ssh says what to install."""
    from helpers.board_only import BLOCKER

    code = BLOCKER + textwrap.dedent(f"""
        from bpuemu.board.cli.hrt_model_exec import main
        main(["infer", "--model_file", {models['rgb']!r}, "--ssh", "root@127.0.0.1:1"])
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("ERROR the ssh transport cannot be loaded"), proc.stderr
    assert lines[1:] == ["Hint: install the host side: pip install 'bpuemu[host]' (paramiko)"], proc.stderr
    assert "Traceback" not in proc.stderr

"""The SSH board with its connection cut mid-SFTP, against a real OpenSSH sshd on loopback.

The connection is cut three ways: the network resets it (tests/board/fault_proxy.py
between hrt_model_exec and sshd) during the model upload, or during the download
of the results, or the board's sshd process serving the session is SIGKILLed
during the upload. Each time the client prints one ERROR line naming the board
and what was cut, exits non-zero, and writes nothing on the host; the work dir
it could not remove is removed by the next session (which says so in a warning
line), and that session's results are right.
"""
import os
import signal
import stat
import time

import pytest

from sshd_harness import REMOTE_COMMAND, Sshd, assert_ok, assert_one_error, run_cli
from fault_proxy import FaultProxy  # noqa: E402 (tests/board is on sys.path through sshd_harness)
from boardd_harness import finish_cli, start_cli  # noqa: E402

#: stderr lines of hrt_model_exec --ssh that are not its error: the random-input note, and the
#: warning about earlier sessions' work dirs removed (left by an earlier failed run of these tests).
RANDOM_NOTE = r"^no --input_file given|.*removed \d+ work dir\(s\) left by earlier sessions"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd_faults")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    from bpuemu.host.samples import sample_bin

    path = str(tmp_path_factory.mktemp("ssh_fault_models") / "fault.bin")
    sample_bin(path, input_type_rt="rgb", height=32, width=32)
    return path


@pytest.fixture
def proxy(sshd, tmp_path):
    """A FaultProxy in front of sshd, and a known_hosts file that trusts the board at the proxy's address."""
    p = FaultProxy({sshd.port: ("127.0.0.1", sshd.port)}).start()
    known_hosts = tmp_path / "known_hosts"
    key_type, key_b64 = sshd.host_pub.split()[:2]
    known_hosts.write_text(f"[{p.host}]:{sshd.port} {key_type} {key_b64}\n")
    p.known_hosts = str(known_hosts)
    p.target = f"root@{p.host}:{sshd.port}"
    try:
        yield p
    finally:
        p.stop()


def _ssh_args(sshd, proxy) -> list:
    return ["--ssh", proxy.target, "--identity", sshd.user_key, "--known-hosts", proxy.known_hosts,
            "--remote-command", REMOTE_COMMAND, "--remote-tmp", sshd.remote_tmp]


def _wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out waiting for the fault's moment")


def _new_work_dir(sshd, before: set) -> str:
    """The path of the work dir this session made (it holds its .owner file)."""
    new = [d for d in sshd.work_dirs() - before if os.path.exists(os.path.join(d, ".owner"))]
    return new[0] if len(new) == 1 else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _next_session_cleans_up(sshd, model, left: str, tmp_path) -> None:
    """The next session (straight to sshd) removes the dead session's work dir, says so, and works."""
    with open(os.path.join(left, ".owner")) as f:
        owner = int(f.read().split()[0])
    _wait_for(lambda: not _pid_alive(owner), timeout=20)  # sshd notices the cut and ends that session
    cwd = tmp_path / "next_run"
    cwd.mkdir()
    result = run_cli(["infer", "--model_file", model, "--enable_dump", "true", *sshd.cli_args()], cwd)
    assert_ok(result)
    assert not os.path.exists(left), f"{left} was not removed by the next session"
    warning = [line for line in result.stderr.splitlines() if "removed" in line and "ended abruptly" in line]
    assert warning and left in warning[0], result.stderr
    assert any(f.endswith(".bin") for f in os.listdir(cwd))


@pytest.mark.parametrize("cut", ["network_reset", "sshd_killed"])
def test_connection_cut_mid_model_upload(sshd, proxy, model, tmp_path, cut):
    proxy.up_rate = 3000  # the 10 KB model takes seconds to upload: the cut lands mid-SFTP
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = sshd.work_dirs()
    cli = start_cli(["infer", "--model_file", model, "--enable_dump", "true", *_ssh_args(sshd, proxy)], cwd)
    left = _wait_for(lambda: _new_work_dir(sshd, before))
    uploading = os.path.join(left, "0_fault.bin")
    _wait_for(lambda: os.path.exists(uploading) and 0 < os.path.getsize(uploading))
    if cut == "network_reset":
        proxy.reset_all()
    else:
        with open(os.path.join(left, ".owner")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)  # the board's sshd process of this session
    line = assert_one_error(finish_cli(cli), proxy.target, "lost during upload of fault.bin", ignore=RANDOM_NOTE)
    assert line.count("ERROR") == 1
    assert os.listdir(cwd) == []  # nothing half-copied on the host
    assert os.path.exists(left)  # the host could not remove it: the board kept it ...
    _next_session_cleans_up(sshd, model, left, tmp_path)  # ... until the next session
    assert sshd.proc.poll() is None


def test_connection_reset_while_downloading_results(sshd, proxy, model, tmp_path):
    # The board-side command says when it is done; from then on the host only downloads (SFTP).
    marker = tmp_path / "command_done"
    wrapper = tmp_path / "board_command.sh"
    wrapper.write_text(f'#!/bin/sh\n{REMOTE_COMMAND} "$@"\nrc=$?\ntouch {marker}\nexit $rc\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    proxy.down_rate = 4000  # the many intermediate dumps take seconds to come back
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = sshd.work_dirs()
    args = ["infer", "--model_file", model, "--enable_dump", "true", "--dump_intermediate", "1",
            *_ssh_args(sshd, proxy)]
    args[args.index(REMOTE_COMMAND)] = str(wrapper)
    cli = start_cli(args, cwd)
    left = _wait_for(lambda: _new_work_dir(sshd, before))
    _wait_for(marker.exists, timeout=60)
    time.sleep(0.3)  # the exit status is through; the downloads have begun
    proxy.reset_all()
    line = assert_one_error(finish_cli(cli), proxy.target, "lost during", ignore=RANDOM_NOTE)
    assert "download" in line or "listing the dumps" in line, line
    assert os.listdir(cwd) == []  # no dump written from a half-read result
    assert os.path.exists(left)
    _next_session_cleans_up(sshd, model, left, tmp_path)


def test_stalled_network_ends_within_the_deadline(sshd, proxy, model, tmp_path):
    """A connection that stops moving bytes mid-SFTP: one DeadlineExceeded, within the SFTP deadline plus cleanup."""
    from bpuemu.common.errors import DeadlineExceeded
    from bpuemu.host.clients.ssh import SshBackend
    from bpuemu.host.clients.ssh_options import SshOptions

    remote_tmp = tmp_path / "board_tmp"
    remote_tmp.mkdir()
    options = SshOptions(target=proxy.target, identity=sshd.user_key, known_hosts=proxy.known_hosts,
                         remote_command=REMOTE_COMMAND, remote_tmp=str(remote_tmp), connect_timeout_s=4.0)
    proxy.up_rate = 3000
    stall = _later_when(lambda: any((d / "0_fault.bin").exists() for d in remote_tmp.iterdir()), proxy.stall)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"did not answer upload of fault.bin within 4 s") as err:
        SshBackend(options, [model])
    elapsed = time.monotonic() - t0
    stall.join()
    assert proxy.target in str(err.value)
    assert elapsed < 30, f"the stalled session took {elapsed:.1f} s to give up with a 4 s SFTP deadline"


def _later_when(predicate, action):
    """Run ``action`` in a thread as soon as ``predicate()`` holds (bounded: 30 s)."""
    import threading

    def watch():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not predicate():
            time.sleep(0.01)
        action()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


"""Boards on a real network: each hrt_boardd in its own network namespace, reached from the root namespace only
through an emulated link (bench/netlab.py: latency, jitter, loss, a rate limit, outages).

These need root; they skip with one line saying why elsewhere, and fail under CI=true.
"""
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.common.container import file_sha256
from bpuemu.common.errors import DeadlineExceeded
from bpuemu.common.wire import UPLOAD_CHUNK_BYTES
from helpers.netboards import lab, netlab, require_namespaces

pytestmark = pytest.mark.timeout(600)


def _round_trip_ms(client: BoardClient, count: int = 15) -> list:
    times = []
    for _ in range(count):
        start = time.monotonic()
        client.stats()
        times.append((time.monotonic() - start) * 1e3)
    return times


def test_each_board_is_its_own_host_behind_its_link(tmp_path):
    """Every board answers at the address the lab gave it in its own namespace, and only through its link: the
    round trip grows with the profile's delay (twice the one-way delay), its processes run inside the namespace."""
    with lab(["lan", "wifi", "bad"], tmp_path) as net:
        medians = {}
        for board in net.boards:
            assert board.address.startswith("198.18.") and board.target.endswith(":9473")
            with BoardClient(board.target, token=net.token) as client:
                assert client.info.hostname  # the handshake crossed the link
                medians[board.profile.name] = statistics.median(_round_trip_ms(client))
            pids = subprocess.run(["ip", "netns", "pids", board.namespace], capture_output=True, text=True).stdout.split()
            assert str(board.daemon.pid) in pids or any(_is_child(int(p), board.daemon.pid) for p in pids), pids
            inside = subprocess.run(["ip", "netns", "exec", board.namespace, "ip", "-o", "-4", "addr"],
                                    capture_output=True, text=True).stdout
            addresses = sorted(line.split()[3] for line in inside.splitlines())
            assert addresses == sorted(["127.0.0.1/8", f"{board.address}/30"]), inside
        assert medians["lan"] < 10, medians
        assert 2 * 0.005e3 <= medians["wifi"] < 2 * 0.005e3 + 30, medians  # 5 ms each way (+- 2 ms jitter)
        assert 2 * 0.040e3 <= medians["bad"] < 2 * 0.040e3 + 60, medians  # 40 ms each way (+- 10 ms jitter)
    assert netlab.leftovers() == []


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


def test_a_link_that_goes_down_fails_calls_by_their_deadline_then_serves(tmp_path):
    """While its link is down, a call to the board ends at its deadline with one line naming the board; once the
    link is back, the same client is served again."""
    with lab(["lan"], tmp_path) as net:
        board = net.boards[0]
        short = Deadlines(connect=2.0, call=2.0)
        with BoardClient(board.target, token=net.token, deadlines=short) as client:
            client.stats()
            net.down(board, 4.0)
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded) as exc:
                client.stats()
            elapsed = time.monotonic() - start
            assert 1.5 < elapsed < 3.5, elapsed
            assert board.target in str(exc.value) and "\n" not in exc.value.message, str(exc.value)
            time.sleep(max(0.0, 4.5 - elapsed))
            deadline = time.monotonic() + 20
            while True:  # TCP retransmits on its own backoff: the link is back within seconds
                try:
                    client.stats()
                    break
                except DeadlineExceeded:
                    assert time.monotonic() < deadline, "the board never answered again after its link came back"
    assert netlab.leftovers() == []


def test_teardown_leaves_nothing_after_a_failure(tmp_path):
    """An exception inside the lab, and a process that made a lab and was killed: no namespace, device or qdisc
    of either is left (the killed one's is removed by the next lab)."""
    require_namespaces()
    with pytest.raises(RuntimeError, match="a test failed here"):
        with netlab.Lab(["wifi", "bad"], workdir=str(tmp_path / "raised")):
            assert len(netlab.leftovers()) >= 4  # two namespaces, two root-side devices (at least)
            raise RuntimeError("a test failed here")
    assert netlab.leftovers() == []

    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(netlab.BENCH_DIR)!r})
        import netlab
        lab = netlab.Lab(["lan"], workdir={str(tmp_path / "killed")!r}).start()
        print("up", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert netlab.leftovers(), "the lab in the child made nothing"
    finally:
        proc.kill()
        proc.wait()
    with netlab.Lab(["lan"], workdir=str(tmp_path / "next")):
        assert not [f for f in netlab.leftovers() if f"{netlab.NS_PREFIX}{proc.pid}-" in f]
    assert netlab.leftovers() == []


@pytest.fixture(scope="module")
def model_100mb(sample_models, tmp_path_factory):
    """A 100 MB model: the rgb sample with an unused random initializer (it loads and runs as the sample does)."""
    path = str(tmp_path_factory.mktemp("model_100mb") / "model_100mb.bin")
    sha = netlab.padded_model(sample_models["rgb"].path, path, 100_000_000)
    return path, sha


def test_100mb_upload_over_bad_resumes_after_the_link_goes_down(tmp_path, model_100mb):
    """A 100 MB upload over the `bad` link, whose link goes down for 5 s in the middle: the cut attempt is followed
    by one that sends only what the board does not hold, the board receives at most one chunk more than the file's
    size, and its copy has the file's SHA-256.

    The stall deadline is 2 s here (15 s by default): with the default a 5 s outage is ridden out by TCP's own
    retransmissions and nothing is cut, which is not what this test is about.
    """
    path, sha = model_100mb
    size = os.path.getsize(path)
    with lab(["bad"], tmp_path) as net:
        board = net.boards[0]
        with BoardClient(board.target, token=net.token, deadlines=Deadlines(upload_stall=2.0)) as client:
            received_before = client.stats().upload_bytes
            outage = {}

            def cut_mid_way():
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    tally = client.last_upload
                    if tally is not None and tally.sent_bytes >= size // 2:
                        outage["at"] = tally.sent_bytes
                        net.down(board, 5.0)
                        return
                    time.sleep(0.05)

            watcher = threading.Thread(target=cut_mid_way)
            watcher.start()
            start = time.monotonic()
            reply = client.upload(path, sha)
            elapsed = time.monotonic() - start
            watcher.join(10)
            tally = client.last_upload
            received = client.stats().upload_bytes - received_before
            assert client.has_model(sha).present and not reply.already_present
        print(f"100 MB over bad, 5 s outage at byte {outage.get('at')}: {elapsed:.1f} s, {tally.attempts} attempts "
              f"from {tally.offsets}, sent {tally.sent_bytes} ({tally.lost_bytes} lost), board received {received}")
        assert "at" in outage, "the upload never got half way"
        # Resumed where the board was: the bytes sent before the outage, less those still in flight when it began.
        assert tally.attempts >= 2 and tally.offsets[0] == 0 and tally.offsets[1] >= outage["at"] - 8 * UPLOAD_CHUNK_BYTES, tally
        assert received - size <= UPLOAD_CHUNK_BYTES, (received, size)  # re-sent beyond what was lost
        assert file_sha256(os.path.join(board.workdir, "models", sha + ".bin")) == sha
    assert netlab.leftovers() == []


def test_farm_failover_over_links_costs_a_lost_board_only_its_item_in_flight(tmp_path, rgb_model):
    """Items spread over four namespaced boards (wifi, bad, lan whose link goes down for longer than the infer
    deadline, lan): the lost board's item in flight fails at its deadline with one line naming the board and is
    redone on another; every output equals one local board's."""
    from bpuemu.board.backends import LocalBackend
    from bpuemu.board.farm import BoardAccess, FarmClient, map_with_failover
    from bpuemu.common.errors import BpuEmuError
    from bpuemu.common.input_types import random_rt_input

    rng = np.random.default_rng(3)
    spec = rgb_model.model.input_specs[0]
    items = [random_rt_input(spec, rng) for _ in range(40)]
    with LocalBackend([rgb_model.path]) as local:
        expected = [local.model().infer([x]).outputs for x in items]
    served, errors = {}, []
    with lab(["wifi", "bad", "lan", "lan"], tmp_path) as net:
        down = net.boards[2]
        access = BoardAccess(token=net.token, deadlines=Deadlines(infer=3.0))
        with FarmClient([b.target for b in net.boards], [rgb_model.path], access) as farm:
            assert all(o.ok for o in farm.boards()), [o.error for o in farm.boards()]
            handles = farm.board_models()

            def work(target, x):
                try:
                    outputs = handles[target].infer([x]).outputs
                except BpuEmuError as exc:
                    errors.append((target, exc.message, time.monotonic() - started[target]))
                    raise
                served[target] = served.get(target, 0) + 1
                if target == down.target and served[target] == 2:
                    net.down(down, 60.0)  # longer than the infer deadline: the board is lost
                return outputs

            started = {}

            def timed_work(target, x):
                started[target] = time.monotonic()
                return work(target, x)

            start = time.monotonic()
            results = dict(map_with_failover({t: t for t in handles}, timed_work, items))
            elapsed = time.monotonic() - start
    assert sorted(results) == list(range(len(items)))
    for i, outputs in results.items():
        assert outputs.keys() == expected[i].keys() and outputs
        for name, want in expected[i].items():
            np.testing.assert_array_equal(outputs[name], want)
    assert served[down.target] == 2, served  # it served two, then its third (in flight) went to the others
    assert sum(served.values()) == len(items), served
    assert len(errors) == 1 and errors[0][0] == down.target, errors
    target, message, seconds = errors[0]
    assert target in message and "\n" not in message, message
    assert seconds < 3.0 + 2.0, f"the lost board's call ended after {seconds:.1f} s (deadline 3 s)"
    assert elapsed < 60, elapsed
    assert netlab.leftovers() == []

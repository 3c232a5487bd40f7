"""hrt_boardd under the attacks of issue 34, each against a real daemon, with an honest client served
throughout and the daemon's peak memory under the attack bounded (tests/board/attacks.py; bench/attacks.py
prints the figures).

1. A model that reads the board's files (ONNX external data): refused at upload and at load.
2. Requests refused only after they are parsed: an unauthenticated request is never read; an authenticated
   one whose parse would grow past a bound is refused before protobuf allocates it.
3. A worker pool that idle calls freeze: stalled calls are bounded per peer and end at the request deadline;
   health watches hold no worker; past --max-concurrent-rpcs, RESOURCE_EXHAUSTED at once.
4. The data channel allocating before the bytes arrive: a frame's buffer grows as its bytes come, within a
   total budget; connection slots are taken only after HELLO (and on the metrics endpoint, after the token).
5. Quotas and hygiene: the store's size, loaded models, loads in job slots, failed authentication logged
   and counted, no board paths in errors, warnings for readable secrets and tokens sent in clear.
"""
import logging
import os
import select
import shutil
import socket
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bpuemu.board.client import BoardClient
from bpuemu.common.errors import InvalidInput, InvalidModelFile, ResourceExhausted, without_paths
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.common.wire import ERROR, HELLO, HELLO_OK, INFER, TOKEN_METADATA_KEY, pack_frame, read_frame

from attacks import (
    MIB, PeakMemory, StalledCalls, announce_infer, data_hello, external_data_bin, honest_infers, own_channel,
    raw_infer, sha_of, store_variant, timed, varint_bomb,
)
from boardd_harness import assert_daemon_serves, wait_until

TOKEN = "s3cret-token-for-the-board-0123456789"


@pytest.fixture
def token_daemon(start_daemon, token_file):
    def start(*extra):
        return start_daemon("--token-file", str(token_file), *extra)

    return start


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --- 1. a model is data -------------------------------------------------------------------------------

@pytest.mark.parametrize("nested", [False, True], ids=["initializer", "constant_in_if_branch"])
def test_a_model_with_external_data_is_refused_at_upload_and_at_load(start_daemon, rgb_model, tmp_path, nested):
    d = start_daemon()
    assert os.path.realpath(f"/proc/{d.proc.pid}/cwd") == os.path.realpath(d.model_dir)  # nothing else there
    with open(os.path.join(d.model_dir, "secret.txt"), "wb") as f:  # what the model would read, were it allowed
        f.write(os.urandom(1 << 16))
    bad = str(tmp_path / "steals.bin")
    tensor = external_data_bin(rgb_model.path, bad, location="secret.txt", nested=nested)
    with PeakMemory(d.proc.pid) as peak, d.client() as board:
        with pytest.raises(InvalidInput) as refused:
            board.upload(bad)
        message = str(refused.value)
        assert f"tensor '{tensor}'" in message and "external data" in message and "secret.txt" in message
        assert d.model_dir not in message
        sha = sha_of(bad)
        assert not board.has_model(sha).present
        # A store written before this check (or by hand): the runtime refuses the piece at load.
        shutil.copy(bad, os.path.join(d.model_dir, f"{sha}.bin"))
        with pytest.raises(InvalidInput) as at_load:
            board.load(sha)
        assert f"tensor '{tensor}'" in str(at_load.value) and "external data" in str(at_load.value)
        with pytest.raises(InvalidInput):
            board.infer(sha, "", [rgb_model.x])
    assert peak.growth < 64 * MIB
    os.unlink(os.path.join(d.model_dir, f"{sha}.bin"))
    os.unlink(os.path.join(d.model_dir, "secret.txt"))
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


# --- 2. authenticate before parsing ---------------------------------------------------------------------

def test_an_unauthenticated_request_is_refused_without_being_read(token_daemon, rgb_model):
    d = token_daemon()
    bomb = varint_bomb(32 * MIB)  # parsed: 32 M int64 = 256 MiB and more
    with own_channel(d.target) as channel:
        raw_infer(channel, b"", None)  # the connection is up before the measure
        with PeakMemory(d.proc.pid) as peak:
            codes = [raw_infer(channel, bomb, token) for token in (None, "wrong-token-but-long-enough-0000")]
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2
    assert peak.growth < 16 * MIB, f"the daemon grew {peak.growth / MIB:.0f} MiB refusing unread requests"
    honest = honest_infers(d, rgb_model, TOKEN)
    assert honest.failed == 0, honest.errors


def test_a_request_whose_parse_would_grow_past_its_bound_is_refused(token_daemon, rgb_model):
    d = token_daemon()
    bomb = varint_bomb(32 * MIB)
    with own_channel(d.target) as channel:
        raw_infer(channel, b"", TOKEN)
        with PeakMemory(d.proc.pid) as peak:
            code = raw_infer(channel, bomb, TOKEN)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # The request's own bytes (gRPC holds them once, and they are sliced once): never the 256 MiB of a parse.
    assert peak.growth < 128 * MIB, f"the daemon grew {peak.growth / MIB:.0f} MiB"
    assert "request refused" in d.log()
    honest = honest_infers(d, rgb_model, TOKEN)
    assert honest.failed == 0, honest.errors


def test_a_data_channel_request_whose_parse_would_grow_past_its_bound_is_refused(token_daemon, rgb_model):
    d = token_daemon()
    port = d.client(TOKEN).info.data_port
    bomb = varint_bomb(32 * MIB)
    s = data_hello(port, TOKEN, timeout=60)
    try:
        with PeakMemory(d.proc.pid) as peak:
            s.sendall(pack_frame(INFER, bomb))
            kind, payload = read_frame(s)
        assert kind == ERROR and bytes(payload).startswith(b"INVALID_ARGUMENT"), bytes(payload[:200])
    finally:
        s.close()
    # The frame's bytes as they came (32 MiB, in a buffer grown by doubling): never the 256 MiB of a parse.
    assert peak.growth < 128 * MIB, f"the daemon grew {peak.growth / MIB:.0f} MiB"
    honest = honest_infers(d, rgb_model, TOKEN)
    assert honest.failed == 0, honest.errors


# --- 3. a worker pool idle calls cannot freeze ------------------------------------------------------

def _stats_and_health(d, token):
    with own_channel(d.target) as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        metadata = ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()
        stats = timed(lambda: stub.GetStats(board_pb2.StatsRequest(), timeout=5, metadata=metadata))
        health = timed(lambda: health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5))
    return stats, health


def test_unauthenticated_stalled_calls_and_health_watches_hold_no_worker(token_daemon, rgb_model):
    d = token_daemon("--max-concurrent-rpcs", "16")
    with PeakMemory(d.proc.pid) as peak, StalledCalls(d.target, 32, connections=2, watches=32) as attack:
        time.sleep(1.0)
        (stats, s_took), (health, h_took) = _stats_and_health(d, TOKEN)
        assert isinstance(stats, board_pb2.BoardStats) and s_took < 5, stats
        assert health.status == health_pb2.HealthCheckResponse.SERVING and h_took < 5
        honest = honest_infers(d, rgb_model, TOKEN)
        assert wait_until(lambda: len(attack.ended()) == 32, timeout=5), "the unauthenticated calls should end"
        assert set(attack.ended()) == {grpc.StatusCode.UNAUTHENTICATED}
    assert honest.failed == 0, honest.errors
    assert peak.growth < 64 * MIB


def test_stalled_calls_of_one_peer_take_a_quarter_of_the_workers_and_end_at_the_deadline(start_daemon, rgb_model):
    d = start_daemon("--max-concurrent-rpcs", "16", "--call-deadline", "4")
    with PeakMemory(d.proc.pid) as peak, StalledCalls(d.target, 16, connections=2, watches=16) as attack:
        # More than this peer's share (16 // 4 = 4) are ended at once, with RESOURCE_EXHAUSTED.
        assert wait_until(lambda: len(attack.ended()) >= 12, timeout=3), attack.ended()
        assert set(attack.ended()) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        (stats, s_took), (health, h_took) = _stats_and_health(d, None)
        assert isinstance(stats, board_pb2.BoardStats) and s_took < 5, stats
        assert health.status == health_pb2.HealthCheckResponse.SERVING and h_took < 5
        honest = honest_infers(d, rgb_model, None)
        # The rest end at the request deadline.
        assert wait_until(lambda: len(attack.ended()) == 16, timeout=8), attack.ended()
        assert attack.ended().count(grpc.StatusCode.DEADLINE_EXCEEDED) == 4
    assert honest.failed == 0, honest.errors
    assert peak.growth < 64 * MIB


def test_calls_past_the_concurrency_limit_are_refused_at_once(start_daemon):
    """Four uploads that hold their workers (their bytes still to come), and one call more: RESOURCE_EXHAUSTED
    at once, not a wait in a queue."""
    import threading

    d = start_daemon("--max-concurrent-rpcs", "4")
    release = threading.Event()

    def held_upload(i):
        yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=f"{i:064x}", size=1000, file_name="x.bin"))
        release.wait()

    with own_channel(d.target) as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        uploads = [stub.UploadModel.future(held_upload(i), timeout=30) for i in range(4)]
        time.sleep(1.0)
        code, took = timed(lambda: stub.GetStats(board_pb2.StatsRequest(), timeout=10))
        release.set()
        for u in uploads:
            u.cancel()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, code
    assert took < 2, f"took {took:.1f} s: a refusal must not wait"


# --- 4. the data channel ---------------------------------------------------------------------------------

def test_data_channel_frames_take_memory_as_their_bytes_come_within_a_total(token_daemon, rgb_model):
    d = token_daemon("--max-data-buffer-mb", "64")
    port = d.client(TOKEN).info.data_port
    socks = []
    try:
        with PeakMemory(d.proc.pid) as announced:
            for _ in range(32):  # 32 x 256 MiB announced, nothing sent: nothing taken
                s = data_hello(port, TOKEN)
                announce_infer(s, 256 * MIB - 1)
                socks.append(s)
            time.sleep(0.5)
            honest = honest_infers(d, rgb_model, TOKEN)
        assert honest.failed == 0, honest.errors
        assert announced.growth < 32 * MIB, f"grew {announced.growth / MIB:.0f} MiB for announced frames"
        readable, _, _ = select.select(socks, [], [], 0.2)
        assert not readable, "an announced frame's connection was answered (refused) before its bytes came"
        for s in socks:
            s.close()
        socks.clear()
        # Frames up to 16 MiB go to each connection's kept buffer, made at the header: the budget bounds those too.
        with PeakMemory(d.proc.pid) as kept:
            for _ in range(8):  # 8 x 15 MiB: 120 MiB without a total
                s = data_hello(port, TOKEN)
                socks.append(s)
                announce_infer(s, 15 * MIB)
            time.sleep(1.0)
        assert kept.growth < 64 * MIB + 16 * MIB, f"grew {kept.growth / MIB:.0f} MiB"
        for s in socks:
            s.close()
        socks.clear()
        refused = 0
        with PeakMemory(d.proc.pid) as sent:
            for _ in range(4):  # 4 frames of 40 MiB, 30 MiB of each sent and held: over the 64 MiB budget
                s = data_hello(port, TOKEN)
                socks.append(s)
                try:
                    announce_infer(s, 40 * MIB, send=30 * MIB)
                except OSError:  # the board refused it and closed the connection mid-send
                    refused += 1
            honest = honest_infers(d, rgb_model, TOKEN)
        for s in socks:
            s.settimeout(10)
            try:
                kind, payload = read_frame(s)
                refused += kind == ERROR and bytes(payload).startswith(b"RESOURCE_EXHAUSTED")
            except OSError:
                pass
        assert refused >= 2
        assert honest.failed == 0, honest.errors
        assert sent.growth < 64 * MIB + 48 * MIB, f"grew {sent.growth / MIB:.0f} MiB"
    finally:
        for s in socks:
            s.close()


def test_idle_sockets_take_no_data_channel_or_metrics_slot(start_daemon, rgb_model):
    d = start_daemon("--max-data-connections", "2", "--metrics-listen", "127.0.0.1:0")
    port = d.client().info.data_port
    metrics_port = _metrics_port(d)
    idle = [socket.create_connection(("127.0.0.1", p), timeout=5) for p in [port] * 8 + [metrics_port] * 16]
    try:
        time.sleep(0.5)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(pack_frame(HELLO, b""))
        assert read_frame(s)[0] == HELLO_OK  # the 8 idle sockets hold no slot of the 2
        s.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
            assert reply.status == 200  # 16 idle sockets, 8 scrape slots: still served
        honest = honest_infers(d, rgb_model, None)
        assert honest.failed == 0, honest.errors
    finally:
        for s in idle:
            s.close()


def _metrics_port(d) -> int:
    import re

    assert wait_until(lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", d.log()), timeout=5)
    return int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", d.log()).group(1))


# --- 5. quotas and hygiene ---------------------------------------------------------------------------------

def test_the_store_keeps_within_its_quota_by_removing_least_recently_used_models(start_daemon, rgb_model, tmp_path):
    size = os.path.getsize(rgb_model.path)
    d = start_daemon("--max-store-mb", f"{2.5 * size / MIB:.6f}")
    paths = [store_variant(rgb_model.path, tmp_path, i) for i in range(4)]
    with d.client() as board:
        first = board.ensure_model(paths[0])
        board.load(first)  # loaded: stays
        second = board.ensure_model(paths[1])
        third = board.ensure_model(paths[2])  # over the quota: the second (not loaded) goes
        stored = {m.sha256 for m in board.list_models()}
        assert stored == {first, third}
        board.load(third)
        with pytest.raises(ResourceExhausted) as full:  # both loaded: nothing may go
            board.ensure_model(paths[3])
        assert "store is full" in str(full.value) and d.model_dir not in str(full.value)
        assert second not in {m.sha256 for m in board.list_models()}


def test_loaded_models_are_capped_and_loads_take_a_job_slot(start_daemon, rgb_model, tmp_path):
    d = start_daemon("--max-loaded-models", "2", "--max-jobs", "1")
    paths = [store_variant(rgb_model.path, tmp_path, i) for i in range(3)]
    with d.client() as board:
        shas = [board.ensure_model(p) for p in paths]
        for sha in shas:
            board.load(sha)
        loaded = {m.sha256 for m in board.list_models() if m.loaded}
        assert loaded == set(shas[1:]), "the least recently used model is unloaded"
        # A load is a job: with the one slot taken by a perf job, loading another model is refused.
        from bpuemu.board.runtime.perf_job import PerfConfig

        stream = board._stub.Perf(board_pb2.PerfRequest(sha256=shas[1], model_name="variant_1", thread_num=1,
                                                         frame_count=1_000_000), metadata=board._metadata, timeout=30)
        next(stream)
        try:
            with pytest.raises(ResourceExhausted):
                board.load(shas[0])
        finally:
            stream.cancel()


def test_failed_authentication_is_logged_with_the_peer_and_counted(token_daemon):
    d = token_daemon("--metrics-listen", "127.0.0.1:0")
    with own_channel(d.target) as channel:
        assert raw_infer(channel, b"", "not-the-token-of-this-board-000") == grpc.StatusCode.UNAUTHENTICATED
    s = socket.create_connection(("127.0.0.1", d.client(TOKEN).info.data_port), timeout=5)
    s.sendall(pack_frame(HELLO, b"not-the-token-either-0000000"))
    assert read_frame(s)[0] == ERROR
    s.close()
    assert wait_until(lambda: "authentication failed" in d.log())
    assert "127.0.0.1" in [line for line in d.log().splitlines() if "authentication failed" in line][0]
    request = urllib.request.Request(f"http://127.0.0.1:{_metrics_port(d)}/metrics",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        text = reply.read().decode()
    assert 'hrt_boardd_auth_failures_total{transport="grpc"} 1.0' in text
    assert 'hrt_boardd_auth_failures_total{transport="data"} 1.0' in text


def test_secret_files_readable_by_others_and_tokens_in_clear_are_warned_about(start_daemon, tmp_path, caplog):
    token_file = tmp_path / "open.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    d = start_daemon("--token-file", str(token_file))
    assert "readable by other users" in d.log() and "chmod 600" in d.log()
    with caplog.at_level(logging.WARNING, logger="bpuemu.board.security"):
        BoardClient("192.0.2.1:9473", token=TOKEN).close()  # TEST-NET: never dialled, the channel is lazy
        BoardClient("127.0.0.1:9473", token=TOKEN).close()
    warned = [r.getMessage() for r in caplog.records if "in clear" in r.getMessage()]
    assert len(warned) == 1 and "192.0.2.1" in warned[0]


def test_errors_to_clients_carry_no_board_paths():
    text = "Load model from /srv/hrt/models/ab12.bin failed: /var/lib/x/secret.txt not found"
    assert without_paths(text) == "Load model from ab12.bin failed: secret.txt not found"

"""Uploads that resume: a cut upload leaves what arrived on the board (never as a model), and the next upload of
the model sends only the rest. The real daemon on loopback; the cuts are real cancelled calls and a real restart.
"""
import os
import threading
import time

import grpc
import pytest

from bpuemu.common.container import file_sha256
from bpuemu.common.errors import NotFound
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.common.wire import UPLOAD_CHUNK_BYTES

from boardd_harness import wait_until
from helpers.netboards import netlab

MIB = 1 << 20


@pytest.fixture(scope="module")
def big_model(sample_models, tmp_path_factory):
    """A 6 MiB model (the rgb sample with an unused random initializer): six upload chunks."""
    path = str(tmp_path_factory.mktemp("big") / "big.bin")
    sha = netlab.padded_model(sample_models["rgb"].path, path, 6 * MIB)
    return path, sha, os.path.getsize(path)


def _cut_upload(daemon, path: str, sha: str, chunks: int, resumable: bool = True) -> None:
    """Send the header and ``chunks`` chunks of ``path``, then cancel the call once the board holds them."""
    size = os.path.getsize(path)
    release = threading.Event()

    def stream():
        yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=size, file_name="cut.bin",
                                                                  resumable=resumable))
        with open(path, "rb") as f:
            for _ in range(chunks):
                yield board_pb2.UploadChunk(data=f.read(UPLOAD_CHUNK_BYTES))
        release.wait(30)

    channel = daemon.channel()
    try:
        call = board_pb2_grpc.BoardStub(channel).UploadModel.future(stream(), timeout=60)
        partial = daemon.model_dir + "/.upload-" + sha
        assert wait_until(lambda: os.path.exists(partial) and os.path.getsize(partial) == chunks * UPLOAD_CHUNK_BYTES,
                          timeout=20), "the board never held the first chunks"
        call.cancel()
        assert wait_until(call.done, timeout=10)
    finally:
        release.set()
        channel.close()


def _no_upload_running(client, sha: str, held: int) -> bool:
    reply = client.has_model(sha)
    return not reply.present and reply.partial_bytes == held


def test_a_cut_upload_resumes_from_what_the_board_holds(start_daemon, big_model):
    path, sha, size = big_model
    d = start_daemon()
    _cut_upload(d, path, sha, chunks=2)
    with d.client() as c:
        assert wait_until(lambda: _no_upload_running(c, sha, 2 * MIB), timeout=10), c.has_model(sha)
        # Half an upload is never a model.
        assert sha not in [m.sha256 for m in c.list_models()]
        with pytest.raises(NotFound):
            c.load(sha)
        received_before = c.stats().upload_bytes
        reply = c.upload(path)
        assert not reply.already_present and reply.bytes_received == size - 2 * MIB
        tally = c.last_upload
        assert tally.offsets == [2 * MIB] and tally.sent_bytes == size - 2 * MIB, tally
        assert c.stats().upload_bytes - received_before == size - 2 * MIB  # the board got each byte once
        assert [m.size for m in c.list_models() if m.sha256 == sha] == [size]
        c.load(sha)
    assert file_sha256(os.path.join(d.model_dir, sha + ".bin")) == sha
    assert not [f for f in os.listdir(d.model_dir) if f.startswith(".upload-")]


def test_a_cut_upload_survives_a_board_restart(start_daemon, big_model):
    path, sha, size = big_model
    d = start_daemon()
    _cut_upload(d, path, sha, chunks=3)
    with d.client() as c:
        assert wait_until(lambda: _no_upload_running(c, sha, 3 * MIB), timeout=10)
    d.stop()
    d.start()
    with d.client() as c:
        assert c.has_model(sha).partial_bytes == 3 * MIB
        sha_returned = c.ensure_model(path)
        assert sha_returned == sha and c.last_upload.offsets == [3 * MIB], c.last_upload
        c.load(sha)


def test_an_upload_that_did_not_ask_to_resume_leaves_nothing(start_daemon, big_model):
    path, sha, _ = big_model
    d = start_daemon()
    _cut_upload(d, path, sha, chunks=2, resumable=False)
    assert wait_until(lambda: not [f for f in os.listdir(d.model_dir) if f.startswith(".upload-")], timeout=10)


def test_a_resume_from_another_offset_stores_nothing_and_says_where(start_daemon, big_model):
    path, sha, size = big_model
    d = start_daemon()
    _cut_upload(d, path, sha, chunks=1)
    with d.client() as c:
        assert wait_until(lambda: _no_upload_running(c, sha, MIB), timeout=10)
    with open(path, "rb") as f:
        data = f.read()
    header = board_pb2.UploadHeader(sha256=sha, size=size, offset=3 * MIB, resumable=True)
    with d.channel() as channel:
        reply = board_pb2_grpc.BoardStub(channel).UploadModel(
            iter([board_pb2.UploadChunk(header=header), board_pb2.UploadChunk(data=data[3 * MIB:4 * MIB])]), timeout=10)
    assert reply.offset_mismatch and reply.held_bytes == MIB and reply.bytes_received == 0
    with d.client() as c:
        assert c.has_model(sha).partial_bytes == MIB


def test_unfinished_uploads_kept_are_bounded(start_daemon, sample_models, tmp_path):
    """At most --max-uploads partial files at once: the oldest idle one goes to make room."""
    path = sample_models["rgb"].path
    d = start_daemon("--max-uploads", "2")
    shas = []
    for i in range(3):
        variant = str(tmp_path / f"v{i}.bin")
        shas.append(netlab.padded_model(path, variant, 3 * MIB, seed=i))
        _cut_upload(d, variant, shas[-1], chunks=1)
        time.sleep(0.05)  # distinct modification times
        with d.client() as c:
            assert wait_until(lambda: _no_upload_running(c, shas[-1], MIB), timeout=10)
    kept = sorted(f[len(".upload-"):] for f in os.listdir(d.model_dir) if f.startswith(".upload-"))
    assert kept == sorted(shas[1:]), (kept, shas)


def test_two_clients_uploading_one_model_share_the_work(start_daemon, big_model):
    """The second waits while the first runs; when the first is cut, the second takes over from what it sent."""
    path, sha, size = big_model
    d = start_daemon()
    with d.client() as c:
        received_before = c.stats().upload_bytes
    first_done = threading.Event()
    outcome = {}

    def second():
        time.sleep(1.0)  # the first upload holds two chunks by then and is still running
        with d.client() as c2:
            outcome["reply"] = c2.upload(path)
            outcome["tally"] = c2.last_upload

    worker = threading.Thread(target=second)
    worker.start()
    _cut_upload(d, path, sha, chunks=2)  # returns once the board holds 2 chunks, then cuts the call
    first_done.set()
    worker.join(60)
    assert not worker.is_alive()
    assert not outcome["reply"].already_present
    with d.client() as c:
        assert c.has_model(sha).present
        assert c.stats().upload_bytes - received_before == size  # no byte of the model sent twice
    assert outcome["tally"].sent_bytes == size - 2 * MIB, outcome["tally"]


def test_unfinished_uploads_count_against_the_store_quota_and_go_first(tmp_path):
    """An interrupted upload's partial file takes disk like a model: it counts against --max-store-mb, and it is
    dropped (oldest first) before a model is evicted to make room for a new upload."""
    from bpuemu.board.daemon.store import ModelStore

    store = ModelStore(str(tmp_path / "store"), max_store_bytes=1000)
    idle = "a" * 64
    with open(store.partial_path(idle), "wb") as f:
        f.write(b"\0" * 800)
    upload = store.begin_upload("b" * 64, 500, "new.bin")
    assert upload is not None
    assert store.partial_bytes(idle) == 0      # the idle partial went to make room
    upload.abort()

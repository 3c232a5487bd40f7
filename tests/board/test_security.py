"""Securing hrt_boardd: TLS and mTLS, tokens, the model store's walls, limits, cancellable perf.

Real daemons on loopback with certificates made in the test (tests/board/
tls_certs.py), driven by the real BoardClient, the raw generated stub, raw
sockets for the data channel, and the real CLIs. After each refused request
the daemon must still serve.
"""
import os
import socket
import ssl
import threading
import time

import grpc
import numpy as np
import pytest

from bpuemu.board.client import BoardClient
from bpuemu.board.daemon.datachannel import DataChannelServer
from bpuemu.board.daemon.state import BoardState, Limits
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.board.security import TlsConfig
from bpuemu.common.container import file_sha256, read_bin, sha256_hex, write_bin
from bpuemu.common.errors import BoardUnavailable, Cancelled, InvalidInput, NotFound, ResourceExhausted, Unauthenticated
from bpuemu.common.proto import board_pb2, board_pb2_grpc, model_pb2
from bpuemu.common.wire import ERROR, HELLO, HELLO_OK, INFER, REPLY, TOKEN_METADATA_KEY, pack_frame, read_frame

from attacks import store_variant
from boardd_harness import (
    assert_daemon_serves,
    assert_ok,
    assert_one_error,
    assert_store_clean,
    clean_env,
    cpu_seconds,
    run_cli,
    wait_until,
)


def _raw_data_channel(port: int, tls_context=None, server_hostname="127.0.0.1"):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if tls_context is not None:
        sock = tls_context.wrap_socket(sock, server_hostname=server_hostname)
    return sock


def _hello(port: int, token: bytes, tls_context=None):
    sock = _raw_data_channel(port, tls_context)
    try:
        sock.sendall(pack_frame(HELLO, token))
        return read_frame(sock)
    finally:
        sock.close()


# --- TLS -----------------------------------------------------------------------------

@pytest.fixture
def tls_daemon(start_daemon, pki):
    """A daemon serving TLS (no client certificates required)."""
    return start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, tls=TlsConfig(ca_file=pki.ca))


def test_tls_handshake_with_self_signed_certificates(tls_daemon, rgb_model, pki):
    d = tls_daemon
    assert "(no token, TLS)" in d.log()
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        over_data = c.infer(sha, "", [rgb_model.x]).outputs
        # The data channel is TLS too, with the same certificate.
        assert isinstance(c._data.sock, ssl.SSLSocket), type(c._data.sock)
        assert c._data.sock.version() in ("TLSv1.2", "TLSv1.3")
        peer = c._data.sock.getpeercert()
        assert ("DNS", "board.bpuemu.test") in peer["subjectAltName"]
    with d.client(data_channel=False) as c:
        over_grpc = c.infer(sha, "", [rgb_model.x]).outputs
        assert c._data is None
    assert np.array_equal(over_data["prob"], over_grpc["prob"])
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_tls_refuses_clients_that_do_not_trust_or_do_not_speak_it(tls_daemon, rgb_model, pki):
    d = tls_daemon
    with BoardClient(d.target, tls=TlsConfig(ca_file=pki.other_ca)) as c:  # trusts another CA
        with pytest.raises(BoardUnavailable, match="not signed by the trusted CA") as exc:
            c.handshake()
        assert exc.value.subject == "tls"  # hrt_model_exec and hb_verifier hint their --tls-* flags
    with BoardClient(d.target, tls=TlsConfig(ca_file=pki.ca, server_name="elsewhere.example")) as c:
        with pytest.raises(BoardUnavailable, match="does not name this host"):
            c.handshake()
    with BoardClient(d.target, tls=TlsConfig(ca_file=pki.ca, server_name="board.bpuemu.test")) as c:
        assert c.handshake().api_version >= 1  # a name the certificate does carry
    with BoardClient(d.target, token="", tls=None) as c:  # plain TCP against a TLS board
        with pytest.raises(BoardUnavailable, match="unreachable") as exc:
            c.handshake()
        assert "if it serves TLS, give its CA" in exc.value.hint and exc.value.subject == "unreachable_plain"
    # A plain HELLO on the TLS data channel gets no HELLO_OK: the board closes the connection.
    with d.client() as c:
        port = c.info.data_port
    sock = _raw_data_channel(port)
    sock.sendall(pack_frame(HELLO, b""))
    with pytest.raises((ConnectionError, ValueError)):
        read_frame(sock)
    sock.close()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_tls_client_flags_and_environment(tls_daemon, rgb_model, pki, scratch):
    d = tls_daemon
    args = ["infer", "--model_file", rgb_model.path, "--board", d.target]
    ok = run_cli(args + ["--tls-ca", pki.ca], scratch)
    assert_ok(ok)
    assert "infer success" in ok.stdout
    assert_ok(run_cli(["model_info", "--model_file", rgb_model.path, "--board", d.target], scratch,
                      env=clean_env(BPUEMU_TLS_CA=pki.ca)))
    line = assert_one_error(run_cli(args, scratch), "unreachable", exit_code=1)  # no TLS: no gRPC noise either
    assert d.target in line
    assert_one_error(run_cli(args + ["--tls-ca", pki.other_ca], scratch), "TLS with board", "not signed", exit_code=1)
    assert_one_error(run_cli(args + ["--tls-ca", str(scratch / "missing.pem")], scratch), "cannot read", exit_code=1)
    result = run_cli(args + ["--tls-ca", pki.ca, "--tls-cert", pki.client_cert], scratch)
    assert result.returncode != 0 and "--tls-cert and --tls-key go together" in result.stderr
    assert "Traceback" not in result.output


def test_mtls_requires_a_client_certificate_from_the_right_ca(start_daemon, rgb_model, pki, scratch):
    good = TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    d = start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", pki.ca, tls=good)
    assert "(no token, mTLS)" in d.log()
    refused = {
        "no client certificate": TlsConfig(ca_file=pki.ca),
        "a certificate from another CA": TlsConfig(ca_file=pki.ca, cert_file=pki.other_client_cert,
                                                   key_file=pki.other_client_key),
    }
    for why, tls in refused.items():
        with BoardClient(d.target, tls=tls) as c:
            with pytest.raises(BoardUnavailable, match="TLS with board") as exc:
                c.handshake()
            assert "client certificate and key" in exc.value.hint and exc.value.subject == "tls", why
        # The data channel asks for the same certificate.
        with d.client() as ok_client:
            port = ok_client.info.data_port
        with pytest.raises((ssl.SSLError, ConnectionError, ValueError)):
            _hello(port, b"", tls.ssl_context())
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        c.infer(sha, "", [rgb_model.x])
        assert isinstance(c._data.sock, ssl.SSLSocket)  # mTLS on the data channel too
    kind, _ = _hello(port, b"", good.ssl_context())
    assert kind == HELLO_OK

    base = ["infer", "--model_file", rgb_model.path, "--board", d.target, "--tls-ca", pki.ca]
    assert_one_error(run_cli(base, scratch), "TLS with board", exit_code=1)
    assert_ok(run_cli(base + ["--tls-cert", pki.client_cert, "--tls-key", pki.client_key], scratch))
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_client_refuses_an_impostor_board(start_daemon, rgb_model, pki):
    """A board with a certificate from another CA is refused by a client that trusts ours."""
    impostor = start_daemon("--tls-cert", pki.other_server_cert, "--tls-key", pki.other_server_key,
                            tls=TlsConfig(ca_file=pki.other_ca, server_name="impostor.bpuemu.test"))
    with BoardClient(impostor.target, tls=TlsConfig(ca_file=pki.ca)) as c:
        with pytest.raises(BoardUnavailable, match="not signed by the trusted CA"):
            c.ensure_model(rgb_model.path)
    assert impostor.store_files() == []


def test_tls_and_token_together(start_daemon, rgb_model, pki, token_file):
    tls = TlsConfig(ca_file=pki.ca)
    token = token_file.read_text().strip()
    d = start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--token-file", str(token_file), tls=tls)
    assert "(token, TLS)" in d.log()
    with d.client(token="") as c:
        with pytest.raises(Unauthenticated, match="no token"):
            c.handshake()
    kind, payload = _hello(d.client(token=token).info.data_port, b"", tls.ssl_context())
    assert kind == ERROR and bytes(payload).startswith(b"UNAUTHENTICATED")
    assert_daemon_serves(d, rgb_model.path, rgb_model.x, token=token)


@pytest.mark.parametrize("case", ["missing", "key_mismatch", "not_pem", "ca_not_pem"])
def test_bad_tls_files_refuse_to_start(tmp_path, pki, case):
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not a certificate\n")
    args = {
        "missing": ["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", pki.server_key],
        "key_mismatch": ["--tls-cert", pki.server_cert, "--tls-key", pki.client_key],
        "not_pem": ["--tls-cert", str(junk), "--tls-key", pki.server_key],
        "ca_not_pem": ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", str(junk)],
    }[case]
    result = run_cli(["--listen", "127.0.0.1:0", "--model-dir", tmp_path / "models", *args], tmp_path,
                     module="bpuemu.board.daemon", timeout=30)
    words = {"missing": ["cannot read", "nope.pem"], "key_mismatch": ["cannot use", "--tls-key"],
             "not_pem": ["cannot use", "junk.pem"], "ca_not_pem": ["cannot use", "--tls-ca"]}[case]
    assert_one_error(result, *words, exit_code=1)
    assert "listening on" not in result.output


@pytest.mark.parametrize("args, message", [
    (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-ca", "ca.pem"], "--tls-ca (client certificates) needs TLS"),
])
def test_incomplete_tls_flags_are_usage_errors(tmp_path, args, message):
    result = run_cli(["--listen", "127.0.0.1:0", "--model-dir", tmp_path / "models", *args], tmp_path,
                     module="bpuemu.board.daemon", timeout=30)
    assert result.returncode == 2 and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_beyond_loopback_without_tls_warns_and_with_tls_does_not(start_daemon, token_file, pki, rgb_model):
    token = token_file.read_text().strip()
    plain = start_daemon("--listen", "0.0.0.0:0", "--token-file", str(token_file))
    assert "beyond loopback without TLS" in plain.log()
    assert_daemon_serves(plain, rgb_model.path, rgb_model.x, token=token)
    secure = start_daemon("--listen", "0.0.0.0:0", "--token-file", str(token_file),
                          "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, tls=TlsConfig(ca_file=pki.ca))
    assert "(token, TLS)" in secure.log() and "without TLS" not in secure.log()


# --- tokens ----------------------------------------------------------------------------

def test_token_near_misses_are_refused_on_grpc_and_the_data_channel(start_daemon, token_file, rgb_model):
    """Prefixes, extensions, other lengths, one changed character: all refused, the exact token accepted.

    hmac.compare_digest compares whole values of any length; a check that stopped at
    the shorter length, or at the first difference, would let a prefix through.
    """
    token = token_file.read_text().strip()
    d = start_daemon("--token-file", str(token_file))
    near_misses = [
        token[:-1], token[:1], token[: len(token) // 2], token + "x", token + token, token[:-1] + chr(ord(token[-1]) ^ 1),
        chr(ord(token[0]) ^ 1) + token[1:], token.upper(), "x" * len(token), "x" * 4000,
    ]
    assert all(m != token for m in near_misses) and len(set(map(len, near_misses))) >= 5
    with d.channel() as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        for value in [f"Bearer {m}" for m in near_misses] + [token, f"bearer {token}", f"Bearer  {token}", "Bearer "]:
            with pytest.raises(grpc.RpcError) as err:
                stub.ListModels(board_pb2.ListModelsRequest(), metadata=[(TOKEN_METADATA_KEY, value)], timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, value
            assert "wrong token" in err.value.details()
        assert stub.ListModels(board_pb2.ListModelsRequest(), metadata=[(TOKEN_METADATA_KEY, f"Bearer {token}")],
                               timeout=10) is not None
    port = d.client(token=token).info.data_port
    for value in [m.encode() for m in near_misses] + [b"", b"\xff" * len(token), token.encode() + b"\0"]:
        kind, payload = _hello(port, value)
        assert kind == ERROR and bytes(payload).startswith(b"UNAUTHENTICATED"), value
    kind, _ = _hello(port, token.encode())
    assert kind == HELLO_OK
    assert_daemon_serves(d, rgb_model.path, rgb_model.x, token=token)


def test_bpuemu_token_environment_reaches_every_client(start_daemon, token_file, rgb_model, monkeypatch):
    token = token_file.read_text().strip()
    d = start_daemon("--token-file", str(token_file))
    monkeypatch.setenv("BPUEMU_TOKEN", token)
    with BoardClient(d.target) as c:  # no token argument: the environment's
        sha = c.ensure_model(rgb_model.path)
        assert c.infer(sha, "", [rgb_model.x]).outputs and c._data is not None
    with BoardClient(d.target, token="") as c:  # "" means none, whatever the environment says
        with pytest.raises(Unauthenticated, match="no token"):
            c.handshake()
    from bpuemu.board.farm import FarmClient

    with FarmClient([d.target], [rgb_model.path]) as farm:
        assert farm.model().sha == sha and farm.model().infer([rgb_model.x]).outputs


@pytest.mark.parametrize("content, words", [
    ("short\n", ["too short"]),
    ("tökén-with-non-ascii-chars-0123\n", ["printable ASCII"]),
    ("token with spaces inside 0123456\n", ["printable ASCII"]),
])
def test_unusable_token_files_are_one_clear_error(tmp_path, scratch, rgb_model, content, words):
    bad = tmp_path / "bad.token"
    bad.write_text(content, encoding="utf-8")
    daemon = run_cli(["--listen", "127.0.0.1:0", "--model-dir", tmp_path / "models", "--token-file", bad], tmp_path,
                     module="bpuemu.board.daemon", timeout=30)
    assert_one_error(daemon, *words, exit_code=1)
    client = run_cli(["model_info", "--model_file", rgb_model.path, "--board", "127.0.0.1:1", "--token-file", bad], scratch)
    assert_one_error(client, *words, exit_code=1)


# --- the model store's walls -----------------------------------------------------------

EVIL_FILE_NAMES = [
    "../../evil.bin", "/etc/passwd", "..", ".", "a/../../b.bin", "..\\..\\windows.bin", "C:\\evil.bin",
    "\x1b[31mred\nFORGED log line", "x" * 1000, "", "ok.bin\0.sh",
]


def test_upload_file_names_never_become_paths(start_daemon, rgb_model, tmp_path):
    d = start_daemon()
    before = sorted(os.listdir(d.workdir))
    shas = {}
    with d.channel() as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        for i, name in enumerate(EVIL_FILE_NAMES):
            path = store_variant(rgb_model.path, tmp_path, i)
            with open(path, "rb") as f:
                data = f.read()
            sha = sha256_hex(data)
            chunks = [board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=len(data), file_name=name)),
                      board_pb2.UploadChunk(data=data)]
            assert stub.UploadModel(iter(chunks), timeout=10).sha256 == sha
            shas[sha] = name
        listed = {m.sha256: m.file_name for m in stub.ListModels(board_pb2.ListModelsRequest(), timeout=10).models}
    assert set(listed) == set(shas)
    for sha, sent in shas.items():
        shown = listed[sha]
        assert "/" not in shown and "\\" not in shown and shown not in (".", ".."), (sent, shown)
        assert shown.isprintable() and len(shown) <= 255, (sent, shown)
    assert listed[next(s for s, n in shas.items() if n == "../../evil.bin")] == "evil.bin"
    assert listed[next(s for s, n in shas.items() if n == "a/../../b.bin")] == "b.bin"
    # Nothing was written anywhere but the store, and the store holds only <sha>.bin/.json.
    assert sorted(os.listdir(d.workdir)) == before
    assert not os.path.exists(os.path.join(os.path.dirname(d.workdir), "evil.bin"))
    assert_store_clean(d)
    assert len(d.store_files()) == 2 * len(EVIL_FILE_NAMES)
    # A newline in a name cannot forge a log line.
    assert not any(line.startswith("FORGED") for line in d.log().splitlines()), d.log()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_every_string_a_request_carries_is_checked(board, rgb_model):
    """Ids, model names, tensor names and dtypes: over gRPC and the data channel, nothing reaches a path."""
    bad_ids = ["../../etc/passwd", "..", "/" + "0" * 63, "0" * 63 + "\0", "0" * 64 + "/../x"]
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        port = c.info.data_port
    sock = _raw_data_channel(port)
    sock.sendall(pack_frame(HELLO, b""))
    assert read_frame(sock)[0] == HELLO_OK

    def data_infer(request):
        sock.sendall(pack_frame(INFER, request.SerializeToString()))
        kind, payload = read_frame(sock)
        assert kind in (REPLY, ERROR)
        return kind, bytes(payload).decode(errors="replace")

    with board.channel() as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        for bad in bad_ids:
            with pytest.raises(grpc.RpcError) as err:
                stub.Infer(board_pb2.InferRequest(sha256=bad), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "is not a model id" in err.value.details()
            kind, text = data_infer(board_pb2.InferRequest(sha256=bad))
            assert kind == ERROR and text.startswith("INVALID_ARGUMENT") and "is not a model id" in text, text
        for name in ["../outside", "/etc/passwd", "sample_32x32_rgb/../x"]:  # looked up by name, never opened
            for call in (lambda: stub.GetModelInfo(board_pb2.ModelInfoRequest(sha256=sha, model_name=name), timeout=10),
                         lambda: stub.Infer(board_pb2.InferRequest(sha256=sha, model_name=name), timeout=10)):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.NOT_FOUND, name
            kind, text = data_infer(board_pb2.InferRequest(sha256=sha, model_name=name))
            assert text.startswith("NOT_FOUND"), text
        x = rgb_model.x
        bad_tensors = {
            "object dtype": board_pb2.Tensor(name="data", dtype="object", shape=[8], data=bytes(64)),
            "string dtype": board_pb2.Tensor(name="data", dtype="S0", shape=[1], data=b""),
            "negative dim": board_pb2.Tensor(name="data", dtype="uint8", shape=[-1, -3072], data=x.tobytes()),
            "wrapping dims": board_pb2.Tensor(name="data", dtype="uint8", shape=[2 ** 62, 4, 0], data=b""),
            "unknown dtype": board_pb2.Tensor(name="../x", dtype="../../int8", shape=[1], data=b"\0"),
        }
        for why, tensor in bad_tensors.items():
            request = board_pb2.InferRequest(sha256=sha, inputs=[tensor])
            with pytest.raises(grpc.RpcError) as err:
                stub.Infer(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (why, err.value)
            kind, text = data_infer(request)
            assert text.startswith("INVALID_ARGUMENT"), (why, text)
        # A handshake's free-text fields cannot forge log lines either.
        stub.Handshake(board_pb2.HandshakeRequest(api_version=1, client_name="evil\nFORGED handshake"), timeout=10)
    sock.close()
    assert not any(line.startswith("FORGED") for line in board.log().splitlines())
    assert "INTERNAL" not in board.log()
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


# --- limits ----------------------------------------------------------------------------

def test_concurrent_uploads_over_the_limit_are_refused(start_daemon, rgb_model, tmp_path):
    d = start_daemon("--max-uploads", "1")
    with open(rgb_model.path, "rb") as f:
        data = f.read()
    release = threading.Event()

    def slow_upload():
        yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256="ab" * 32, size=len(data) * 2, file_name="slow.bin"))
        yield board_pb2.UploadChunk(data=data)
        release.wait(30)

    channel = d.channel()
    try:
        future = board_pb2_grpc.BoardStub(channel).UploadModel.future(slow_upload(), timeout=30)
        assert wait_until(lambda: any(f.startswith(".upload-") for f in os.listdir(d.model_dir)), timeout=10)
        other = store_variant(rgb_model.path, tmp_path, 1)
        with d.client() as c:
            with pytest.raises(ResourceExhausted, match="1 uploads already in progress") as exc:
                c.ensure_model(other)
            assert exc.value.grpc_status == "RESOURCE_EXHAUSTED" and "--max-uploads" in exc.value.hint
            future.cancel()
        # The cancelled upload gives its slot back.
        with d.client() as c:
            assert wait_until(lambda: not any(f.startswith(".upload-") for f in os.listdir(d.model_dir)), timeout=10)
            deadline = time.monotonic() + 5
            while True:
                try:
                    assert c.ensure_model(other)
                    break
                except ResourceExhausted:
                    assert time.monotonic() < deadline, "the cancelled upload kept its slot"
                    time.sleep(0.1)
    finally:
        release.set()
        channel.close()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def _upload_files(model_dir) -> list:
    return [f for f in os.listdir(model_dir) if f.startswith(".upload-")]


def _held_upload(sha: str, data: bytes, release: threading.Event, size: int = 0):
    """An upload stream that sends half the model, then waits for `release` before the rest."""
    yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=size or len(data), file_name="held.bin"))
    yield board_pb2.UploadChunk(data=data[:len(data) // 2])
    release.wait(30)
    yield board_pb2.UploadChunk(data=data[len(data) // 2:])


def _uploads_in_threads(d, path: str, n: int):
    """Start n clients uploading the file at once; returns (threads, outcomes: index -> reply or error)."""
    outcomes = {}

    def upload(i):
        try:
            with d.client() as c:
                outcomes[i] = c.upload(path)
        except BaseException as exc:  # noqa: BLE001 - inspected by the caller
            outcomes[i] = exc

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, outcomes


def _waiting(d, sha: str) -> int:
    return d.log().count(f"upload of {sha[:12]} waits for the one of the same model in progress")


def test_uploads_of_one_model_share_one_slot(start_daemon, rgb_model, tmp_path):
    """N+1 clients sending the same model with --max-uploads N all succeed; distinct models still hit the limit."""
    n = 2
    d = start_daemon("--max-uploads", str(n))
    with open(rgb_model.path, "rb") as f:
        data = f.read()
    sha = file_sha256(rgb_model.path)
    release_first, release_other = threading.Event(), threading.Event()
    channel = d.channel()
    try:
        stub = board_pb2_grpc.BoardStub(channel)
        first = stub.UploadModel.future(_held_upload(sha, data, release_first), timeout=30)
        assert wait_until(lambda: len(_upload_files(d.model_dir)) == 1, timeout=10)
        # A different model takes the second slot and stays in progress.
        other = stub.UploadModel.future(_held_upload("ab" * 32, data, release_other, size=2 * len(data)), timeout=30)
        assert wait_until(lambda: len(_upload_files(d.model_dir)) == 2, timeout=10)
        threads, outcomes = _uploads_in_threads(d, rgb_model.path, n)
        assert wait_until(lambda: _waiting(d, sha) == n, timeout=10), d.log()
        # Waiting uploads take no slot: two distinct models run, so a third distinct one is refused.
        with d.client() as c:
            with pytest.raises(ResourceExhausted, match=f"{n} uploads already in progress"):
                c.upload(store_variant(rgb_model.path, tmp_path, 1))
        assert len(_upload_files(d.model_dir)) == 2, "a waiting upload wrote a temporary file"
        release_first.set()
        assert first.result(timeout=20).bytes_received == len(data)
        for t in threads:
            t.join(20)
        assert all(isinstance(r, board_pb2.UploadReply) and r.already_present for r in outcomes.values()), outcomes
        assert len(outcomes) == n
        other.cancel()
    finally:
        release_first.set()
        release_other.set()
        channel.close()
    assert wait_until(lambda: not _upload_files(d.model_dir), timeout=10)
    assert d.store_files() == sorted([sha + ".bin", sha + ".json"])
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_upload_waiting_for_a_dead_uploader_takes_over(start_daemon, rgb_model, tmp_path):
    """The first uploader of a model dies mid-stream: one waiter stores the model from its own stream."""
    n = 3
    d = start_daemon("--max-uploads", "1")
    path = store_variant(rgb_model.path, tmp_path, 2)
    with open(path, "rb") as f:
        data = f.read()
    sha = file_sha256(path)
    release = threading.Event()
    channel = d.channel()
    try:
        first = board_pb2_grpc.BoardStub(channel).UploadModel.future(_held_upload(sha, data, release), timeout=30)
        assert wait_until(lambda: len(_upload_files(d.model_dir)) == 1, timeout=10)
        threads, outcomes = _uploads_in_threads(d, path, n)
        assert wait_until(lambda: _waiting(d, sha) == n, timeout=10), d.log()
        first.cancel()  # the first client goes away with half the model sent
        for t in threads:
            t.join(30)
    finally:
        release.set()
        channel.close()
    assert len(outcomes) == n and all(isinstance(r, board_pb2.UploadReply) for r in outcomes.values()), outcomes
    stored = [r for r in outcomes.values() if not r.already_present]
    assert len(stored) == 1 and stored[0].bytes_received == len(data), outcomes
    assert wait_until(lambda: not _upload_files(d.model_dir), timeout=10)
    assert d.store_files() == sorted([sha + ".bin", sha + ".json"])
    with open(os.path.join(d.model_dir, sha + ".bin"), "rb") as f:
        assert f.read() == data
    assert_daemon_serves(d, path, rgb_model.x)


def test_infer_is_refused_while_all_job_slots_run_perf(start_daemon, rgb_model):
    d = start_daemon("--max-jobs", "1")
    running = threading.Event()
    stop = threading.Event()
    outcome = {}
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)

        def perf():
            try:
                c.perf(sha, "", PerfConfig(perf_time_minutes=1.0), progress=lambda *a: running.set(), cancel=stop)
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        worker = threading.Thread(target=perf)
        worker.start()
        try:
            assert running.wait(10)
            assert c.stats().jobs_running == 1
            with pytest.raises(ResourceExhausted, match="1 jobs already running; infer refused"):
                c.infer(sha, "", [rgb_model.x])  # the data channel
            with d.client(data_channel=False) as g, pytest.raises(ResourceExhausted, match="infer refused"):
                g.infer(sha, "", [rgb_model.x])  # gRPC
            assert c.stats().refused_busy == 2
        finally:
            stop.set()
            worker.join(30)
        assert isinstance(outcome.get("error"), Cancelled)
        assert wait_until(lambda: c.stats().jobs_running == 0, timeout=5)  # the job lets go of its slot
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_data_channel_connections_over_the_limit_are_refused(start_daemon, rgb_model):
    d = start_daemon("--max-data-connections", "2")
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        port = c.info.data_port
    held = []
    try:
        for _ in range(2):
            s = _raw_data_channel(port)
            s.sendall(pack_frame(HELLO, b""))
            assert read_frame(s)[0] == HELLO_OK
            held.append(s)
        kind, payload = _hello(port, b"")
        assert kind == ERROR and bytes(payload).startswith(b"RESOURCE_EXHAUSTED")
        assert b"2 data channel connections" in bytes(payload)
        with d.client() as c:  # refused on the data channel, the client carries on over gRPC
            assert c.infer(sha, "", [rgb_model.x]).outputs and c._data is None
    finally:
        for s in held:
            s.close()
    assert wait_until(lambda: _hello(port, b"")[0] == HELLO_OK, timeout=5)
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_data_channel_closes_connections_that_send_no_hello(tmp_path):
    server = DataChannelServer("127.0.0.1", BoardState(str(tmp_path / "models"), Limits()), None,
                               hello_timeout_s=0.5).start()
    try:
        sock = _raw_data_channel(server.port)
        t0 = time.monotonic()
        sock.settimeout(10)
        assert sock.recv(16) == b""  # closed by the board, without a word
        assert 0.4 < time.monotonic() - t0 < 5
        sock.close()
    finally:
        server.stop()


# --- perf: bounded and cancellable -------------------------------------------------------

def test_perf_cancelled_by_the_caller_stops_on_the_board(start_daemon, rgb_model):
    d = start_daemon("--max-jobs", "1")
    cancel = threading.Event()
    seen = []
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)

        def progress(done, total, elapsed):
            seen.append(done)
            if len(seen) == 2:
                cancel.set()

        t0 = time.monotonic()
        with pytest.raises(Cancelled, match="cancelled by the caller"):
            c.perf(sha, "", PerfConfig(perf_time_minutes=1.0, thread_num=2), progress=progress, cancel=cancel)
        assert time.monotonic() - t0 < 10 and len(seen) >= 2
        # The slot comes back and the board goes idle: the job really stopped.
        assert wait_until(lambda: c.stats().jobs_running == 0, timeout=5)
        before = cpu_seconds(d.proc.pid)
        time.sleep(1.0)
        assert cpu_seconds(d.proc.pid) - before < 0.3, "the cancelled perf job is still running"
        assert c.perf(sha, "", PerfConfig(frame_count=3)).frame_count == 3
        assert c.stats().perf_jobs == 2
        # An event that is never set changes nothing.
        assert c.perf(sha, "", PerfConfig(frame_count=3), cancel=threading.Event()).frame_count == 3


def test_stats_count_what_the_board_did(start_daemon, rgb_model):
    d = start_daemon()
    with d.client() as c:
        first = c.stats()
        assert first.infer_calls == 0 and first.uploads == 0 and first.rss_bytes > 10 << 20
        sha = c.ensure_model(rgb_model.path)
        c.infer(sha, "", [rgb_model.x], frame_count=3)  # data channel
        with pytest.raises(InvalidInput):
            c.infer(sha, "", [np.zeros(3, np.uint8)])
        with pytest.raises(NotFound):
            c.infer("0" * 64, "", [rgb_model.x])
        with d.client(data_channel=False) as g:
            g.infer(sha, "", [rgb_model.x])  # gRPC
        s = c.stats()
    assert (s.infer_calls, s.infer_frames, s.infer_errors, s.uploads, s.jobs_running) == (4, 4, 2, 1, 0)
    assert s.uptime_s > first.uptime_s and s.hostname == c.info.hostname


def test_hrt_model_exec_and_hb_verifier_share_the_connection_flags(start_daemon, rgb_model, pki, token_file, tmp_path):
    """The same --token-file/--tls-* flags (one definition, bpuemu.board.cli.options) reach a mTLS board from both."""
    d = start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", pki.ca,
                     "--token-file", str(token_file), tls=TlsConfig(pki.ca, pki.client_cert, pki.client_key))
    flags = ["--token-file", str(token_file), "--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key]
    exe = run_cli(["infer", "--model_file", rgb_model.path, "--board", f"grpc://{d.target}", *flags], tmp_path)
    assert_ok(exe)
    ver = run_cli(["-m", rgb_model.path, "-s", "True", "-b", f"grpc://{d.target}", *flags], tmp_path,
                  module="bpuemu.host.cli.hb_verifier")
    assert_ok(ver)
    assert "Arm and Sim result Strict check PASSED" in ver.stdout
    without_cert = run_cli(["-m", rgb_model.path, "-s", "True", "-b", f"grpc://{d.target}", *flags[:4]], tmp_path,
                           module="bpuemu.host.cli.hb_verifier")
    assert_one_error(without_cert, d.target)

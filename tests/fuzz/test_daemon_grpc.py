"""Every gRPC method of hrt_boardd fuzzed with random, well-typed requests against a real daemon.

The daemon runs as its own process on loopback (tests/board/boardd_harness),
with small perf caps so a fuzzed perf job stays short. For each method,
requests are drawn from the proto's message types (fuzzing.messages), biased
toward values the daemon knows (a stored model's SHA-256, its model name,
tensors of the right dtype and size), or are the valid request mutated; some
carry unknown fields, as a newer client's may (so the methods whose request is
an empty message, ListModels and GetStats, get their share of the examples
too; the test asserts the spread). Properties, after every call:

- the answer is OK or a defined status with a message: never UNKNOWN,
  INTERNAL, UNAVAILABLE, UNIMPLEMENTED or DATA_LOSS; never DEADLINE_EXCEEDED
  (the daemon's caps end every job in about a second, so a call still running
  after the generous CALL_S hangs); RESOURCE_EXHAUSTED only for an upload that
  announces more than the board's limit (the calls run one at a time, so
  "board is busy" means an earlier job never ended);
- the valid request of the method (the stored model, a right input), unknown
  fields or not, is answered OK whatever was called before;
- no job is left running, none was refused as busy (GetStats);
- the daemon still serves (a handshake answers);
- the store holds only complete files: <sha>.bin whose content has that
  SHA-256 and decodes, each with its <sha>.json.
"""
import hashlib
import os
import sys
import time

import grpc
import pytest
from hypothesis import strategies as st

from bpuemu.common.container import decode_bin, read_bin
from bpuemu.common.input_types import rt_byte_size
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.common.version import API_VERSION, __version__

from fuzzing import BUDGET, messages, mutated, run_counted, with_unknown_fields

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "board"))
from boardd_harness import Daemon, STORE_FILE_RE, clean_env  # noqa: E402

#: Deadline of one fuzzed call: generous, since the caps below end any job in about a second; a call
#: still running then is a hang (a failure), not a slow answer.
CALL_S = 30.0
#: How long a job may still count as running after its call answered.
JOB_END_S = 5.0
#: The board's upload limit: an upload announcing more is RESOURCE_EXHAUSTED.
MAX_MODEL_MB = 16
#: Daemon flags: perf and infer capped small so that a random request finishes (or is refused) quickly.
DAEMON_ARGS = ("--max-frame-count", "200", "--max-perf-time", "0.01", "--max-model-mb", str(MAX_MODEL_MB),
               "--log-level", "WARNING")

BAD_CODES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
             grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.DEADLINE_EXCEEDED}

UNARY = {
    "Handshake": board_pb2.HandshakeRequest, "HasModel": board_pb2.ModelRef, "LoadModel": board_pb2.ModelRef,
    "UnloadModel": board_pb2.ModelRef, "ListModels": board_pb2.ListModelsRequest,
    "GetModelInfo": board_pb2.ModelInfoRequest, "Infer": board_pb2.InferRequest, "GetStats": board_pb2.StatsRequest,
    "Perf": board_pb2.PerfRequest,
}
METHODS = (*UNARY, "UploadModel")

DTYPES = ["uint8", "int8", "float32", "float64", "int64", "bool", "", "object", "S3", "<U2", "complex64", "V4", "f2"]


def start_fuzz_daemon(workdir) -> Daemon:
    daemon = Daemon(workdir, *DAEMON_ARGS, env=clean_env()).start()
    daemon.owner_pid = os.getpid()  # bench/fuzz.py checks it from forked children, which cannot wait() for it
    return daemon


def _alive(daemon: Daemon) -> bool:
    if os.getpid() == getattr(daemon, "owner_pid", os.getpid()):
        return daemon.proc.poll() is None
    try:
        os.kill(daemon.proc.pid, 0)
        return True
    except ProcessLookupError:
        return False


class Target:
    """What the strategies aim at: the daemon, its stored models, their inputs."""

    def __init__(self, daemon: Daemon, sample_paths):
        self.daemon = daemon
        self.channel = daemon.channel()
        self.stub = board_pb2_grpc.BoardStub(self.channel)
        self.files = {}
        for path in sample_paths:
            with open(path, "rb") as f:
                data = f.read()
            self.files[hashlib.sha256(data).hexdigest()] = (data, read_bin(path).model())
        self.known = sorted(self.files)
        first = self.files[self.known[0]][0]
        self._upload(first)  # one model stored, one not: both cases get fuzzed

    def _upload(self, data: bytes) -> None:
        sha = hashlib.sha256(data).hexdigest()
        chunks = [board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=len(data), file_name="m.bin")),
                  board_pb2.UploadChunk(data=data)]
        self.stub.UploadModel(iter(chunks), timeout=30)

    def close(self) -> None:
        self.channel.close()

    # --- strategies ---------------------------------------------------------------------
    def shas(self):
        return st.one_of(st.sampled_from(self.known), st.sampled_from(self.known).map(str.upper),
                         st.text("0123456789abcdef", min_size=64, max_size=64), st.text(max_size=70))

    def names(self):
        return st.one_of(st.just(""), st.sampled_from([m.name for _, m in self.files.values()]), st.text(max_size=20))

    def tensors(self):
        specs = [m.input_specs[0] for _, m in self.files.values()]

        @st.composite
        def tensor(draw):
            spec = draw(st.sampled_from(specs))
            t = board_pb2.Tensor(name=draw(st.sampled_from([spec.name, "", "x"])),
                                 dtype=draw(st.one_of(st.sampled_from(DTYPES), st.text(max_size=6))))
            if draw(st.booleans()):
                from bpuemu.common.input_types import rt_shape

                t.shape.extend(rt_shape(spec))
            else:
                t.shape.extend(draw(st.lists(st.one_of(st.integers(-2, 40), st.integers(-(2**63), 2**63 - 1)), max_size=5)))
            n = rt_byte_size(spec)
            size = draw(st.sampled_from([0, 1, n - 1, n, n * 4, n + 3]))
            t.data = draw(st.binary(min_size=size, max_size=size))
            return t

        return tensor()

    def frames(self):
        return st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1))

    def requests(self, method: str = ""):
        """(method, request) pairs of ``method``, or of every method."""
        over = {"sha256": self.shas(), "model_name": self.names(), "inputs": st.lists(self.tensors(), max_size=2),
                "frame_count": self.frames(), "perf_time_minutes": st.one_of(st.just(0.0), st.floats(0, 0.005), st.floats()),
                "thread_num": st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1)),
                "api_version": st.one_of(st.just(API_VERSION), st.integers(0, 2**32 - 1)),
                "client_version": st.one_of(st.just(__version__), st.text(max_size=12))}
        calls = {"UploadModel": st.one_of(self.uploads(), st.just(self.valid_request("UploadModel")))}
        for name, cls in UNARY.items():
            valid = self.valid_request(name)
            drawn = st.one_of(messages(cls.DESCRIPTOR, over), st.just(valid))
            calls[name] = st.one_of(drawn, mutated(valid, max_mutations=2), with_unknown_fields(drawn))
        methods = [method] if method else list(METHODS)
        return st.sampled_from(methods).flatmap(lambda m: st.tuples(st.just(m), calls[m]))

    def valid_request(self, method: str):
        """A request the daemon answers OK (the stored model, a right input); fuzzing mutates it.
        UploadModel's: the whole of the model not stored at the start, in one data chunk."""
        from bpuemu.common.input_types import rt_shape

        if method == "UploadModel":
            data = self.files[self.known[1]][0]
            return [board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=self.known[1], size=len(data),
                                                                        file_name="m.bin")),
                    board_pb2.UploadChunk(data=data)]
        sha = self.known[0]
        spec = self.files[sha][1].input_specs[0]
        x = board_pb2.Tensor(name=spec.name, dtype="float32" if spec.input_type_rt == "featuremap" else "uint8",
                             shape=rt_shape(spec), data=bytes(rt_byte_size(spec)))
        return {
            "Handshake": board_pb2.HandshakeRequest(api_version=API_VERSION, client_version=__version__),
            "HasModel": board_pb2.ModelRef(sha256=sha), "LoadModel": board_pb2.ModelRef(sha256=sha),
            "UnloadModel": board_pb2.ModelRef(sha256=sha), "ListModels": board_pb2.ListModelsRequest(),
            "GetModelInfo": board_pb2.ModelInfoRequest(sha256=sha), "GetStats": board_pb2.StatsRequest(),
            "Infer": board_pb2.InferRequest(sha256=sha, inputs=[x], frame_count=1),
            "Perf": board_pb2.PerfRequest(sha256=sha, inputs=[x], frame_count=5, thread_num=1, profile=True),
        }[method]

    def uploads(self):
        """A stream of UploadChunks: mostly a header then data, sometimes anything."""
        @st.composite
        def stream(draw):
            data = draw(st.one_of(st.sampled_from([d for d, _ in self.files.values()]), st.binary(max_size=512)))
            cut = draw(st.integers(0, len(data)))
            body = data if draw(st.booleans()) else data[:cut]
            sha = draw(st.one_of(st.just(hashlib.sha256(data).hexdigest()), st.just(hashlib.sha256(body).hexdigest()),
                                 self.shas()))
            size = draw(st.one_of(st.just(len(data)), st.just(len(body)), st.integers(0, 2**64 - 1)))
            header = board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=size,
                                                                          file_name=draw(st.text(max_size=30))))
            pieces = [body[i:i + 256] for i in range(0, len(body), 256)]
            chunks = [header] + [board_pb2.UploadChunk(data=p) for p in pieces]
            if draw(st.integers(0, 5)) == 0:
                chunks = draw(st.permutations(chunks)) + draw(st.lists(messages(board_pb2.UploadChunk.DESCRIPTOR), max_size=2))
            return chunks

        return stream()

    # --- the property -------------------------------------------------------------------
    def is_valid(self, method: str, request) -> bool:
        """The method's valid request, once unknown fields are dropped."""
        if method == "UploadModel":
            return request == self.valid_request(method)
        plain = type(request)()
        plain.CopyFrom(request)
        plain.DiscardUnknownFields()
        return plain == self.valid_request(method)

    def call(self, method: str, request) -> str:
        """Make the call, check the answer and the daemon; the outcome is "<method> <status>"."""
        code = grpc.StatusCode.OK
        try:
            if method == "UploadModel":
                self.stub.UploadModel(iter(request), timeout=CALL_S)
            elif method == "Perf":
                for _ in self.stub.Perf(request, timeout=CALL_S):
                    pass
            else:
                getattr(self.stub, method)(request, timeout=CALL_S)
        except grpc.RpcError as exc:
            code = exc.code()
            assert code not in BAD_CODES, f"{method} answered {code.name}: {exc.details()}\n{self.daemon.log()[-3000:]}"
            assert code != grpc.StatusCode.RESOURCE_EXHAUSTED or self.over_the_limit(method, request), (
                f"{method} answered RESOURCE_EXHAUSTED to a request within the board's limits: {exc.details()}")
            assert exc.details(), f"{method} answered {code.name} with no message"
        assert code == grpc.StatusCode.OK or not self.is_valid(method, request), (
            f"{method} answered {code.name} to its valid request {request}")
        self.check_daemon()
        return f"{method} {code.name}"

    @staticmethod
    def over_the_limit(method: str, request) -> bool:
        """An upload whose header announces more than the board takes."""
        return (method == "UploadModel" and bool(request) and request[0].WhichOneof("part") == "header"
                and request[0].header.size > MAX_MODEL_MB << 20)

    def check_daemon(self) -> None:
        assert _alive(self.daemon), f"hrt_boardd died:\n{self.daemon.log()[-3000:]}"
        reply = self.stub.Handshake(board_pb2.HandshakeRequest(api_version=API_VERSION, client_version=__version__),
                                    timeout=10, wait_for_ready=True)
        assert reply.board.daemon_version
        deadline = time.monotonic() + JOB_END_S
        while True:
            stats = self.stub.GetStats(board_pb2.StatsRequest(), timeout=10)
            if stats.jobs_running == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert stats.jobs_running == 0, f"{stats.jobs_running} job(s) still running {JOB_END_S} s after their call ended"
        assert stats.refused_busy == 0, "a call was refused as busy, although the calls run one at a time"
        files = self.daemon.store_files()
        stray = [f for f in files if not STORE_FILE_RE.match(f)]
        assert not stray, f"unexpected files in the model store: {stray}"
        for f in files:
            if f.endswith(".bin"):
                assert f[:-4] + ".json" in files, f"{f} is half-published"
                with open(os.path.join(self.daemon.model_dir, f), "rb") as fh:
                    data = fh.read()
                assert hashlib.sha256(data).hexdigest() == f[:-4], f"{f} does not hold what its name says"
                decode_bin(data, f)


def properties(target: Target):
    return {"grpc_methods": (target.requests(), lambda call: target.call(*call))}


@pytest.fixture(scope="module")
def target(tmp_path_factory, sample_bins):
    daemon = start_fuzz_daemon(tmp_path_factory.mktemp("fuzz_boardd"))
    t = Target(daemon, [sample_bins["rgb"], sample_bins["featuremap"]])
    try:
        yield t
    finally:
        t.close()
        code = daemon.stop()
        assert code == 0, daemon.log()[-3000:]


@pytest.mark.parametrize("method", METHODS)
def test_grpc_methods(target, method):
    """Each method gets an equal share of the budget (drawn together, the calls that draw large requests
    got a fifth of the examples of the empty requests)."""
    budget = max(BUDGET // len(METHODS), 10)
    outcomes = run_counted(target.requests(method), lambda call: target.call(*call), max_examples=budget)
    assert sum(outcomes.values()) >= budget // 2, outcomes


@pytest.mark.parametrize("method", METHODS)
def test_the_valid_request_is_answered_ok(target, method):
    """The control: without it, a daemon refusing everything with a defined status would pass the fuzzer."""
    assert target.call(method, target.valid_request(method)) == f"{method} OK"

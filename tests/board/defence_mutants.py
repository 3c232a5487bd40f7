"""Each defence of issue 34 removed in turn, its test in tests/board/test_attacks.py run, the code restored.

    .venv/bin/python tests/board/defence_mutants.py [NAME ...]

Every line must say rc=1 (the test fails without its defence). Edits the source tree while it runs: run it on
a clean checkout, and let it finish (each file is restored in a finally).
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
T = "tests/board/test_attacks.py"
MUTANTS = [
 ("piece guard off", "board/runtime/piece_guard.py",
  '''    try:
        model = _model_class().FromString(blob)''', '''    return
    try:
        model = _model_class().FromString(blob)''', "external_data"),
 ("daemon not in its store", "board/cli/hrt_boardd.py", "    os.chdir(server.state.store.root)\n", "", "external_data and initializer"),
 ("deny handler parses", "board/daemon/interceptor.py",
  '''        return grpc.stream_unary_rpc_method_handler(deny, request_deserializer=_unparsed)''',
  '''        real = continuation(handler_call_details)

        def deny_unary(request, context):
            deny(iter(()), context)
        return grpc.unary_unary_rpc_method_handler(deny_unary, request_deserializer=real.request_deserializer)''',
  "unauthenticated_request_is_refused"),
 ("no parse bound", "board/daemon/interceptor.py",
  '''                    return parse_bounded(cls, data)''', '''                    return cls.FromString(data)''', "parse_would_grow"),
 ("data channel parse unbounded", "board/messages.py",
  "        self._parser = _StreamParser(board_pb2.InferRequest, (_INPUTS,), bounded=True)",
  "        self._parser = _StreamParser(board_pb2.InferRequest, (_INPUTS,))", "data_channel_request_whose_parse"),
 ("watches wrapped (hold a worker)", "board/daemon/interceptor.py",
  '''    if _non_blocking(handler):  # a health watch''', '''    if False:  # a health watch''', "unauthenticated_stalled_calls"),
 ("no per-peer stalled share", "board/daemon/interceptor.py",
  '''                for key, context in calls[self.stalled_per_peer:]:''', '''                for key, context in calls[10**6:]:''', "stalled_calls_of_one_peer"),
 ("no maximum_concurrent_rpcs", "board/daemon/server.py",
  '''            maximum_concurrent_rpcs=max_workers,''', '''            maximum_concurrent_rpcs=None,''', "concurrency_limit"),
 ("frame allocated at its header", "common/wire.py",
  '''            room = min(length, max(2 * got, GROW_BYTES)) - got''', '''            room = length - got''', "data_channel_frames"),
 ("kept buffer outside the budget", "common/wire.py",
  "                self._hold_kept(size - len(self._buf))\n", "", "data_channel_frames"),
 ("no total data budget", "board/daemon/datachannel.py",
  '''        self.buffers = ByteBudget(state.limits.max_data_buffer_bytes)''', '''        self.buffers = None''', "data_channel_frames"),
 ("data slot before HELLO (pending = slots)", "board/daemon/datachannel.py",
  "PENDING_CONNECTIONS = 64", "PENDING_CONNECTIONS = 2", "idle_sockets"),
 ("metrics slot before auth", "board/daemon/metrics.py",
  '''        self._connections = threading.BoundedSemaphore(PENDING_CONNECTIONS)  # open, not yet authenticated''',
  '''        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)  # open, not yet authenticated''', "idle_sockets"),
 ("no store quota", "board/daemon/store.py",
  '''        if not self.max_store_bytes:
            return''', '''        if True:
            return''', "store_keeps"),
 ("no loaded-model cap", "board/daemon/state.py",
  '''        while len(self._loaded) > self.limits.max_loaded_models:''', '''        while False:''', "loaded_models_are_capped"),
 ("load outside job slots", "board/daemon/state.py",
  '''        with self.job("load"), self.queued(kind):
            return self.load(sha)''', '''        with self.queued(kind):
            return self.load(sha)''', "loaded_models_are_capped"),
 ("auth failures not logged/counted", "board/daemon/interceptor.py",
  '''        if self.metrics is not None:
            self.metrics.auth_failure(transport)''', '''        return''', "failed_authentication"),
 ("no secret/clear warnings", "board/security.py",
  '''    if mode & (stat.S_IRGRP | stat.S_IROTH) and path not in _warned:''', '''    if False:''', "secret_files"),
 ("paths kept", "common/errors.py",
  '''    return _ABSOLUTE_PATH.sub("", text)''', '''    return text''', "carry_no_board_paths"),
]
only = sys.argv[1:]
for name, path, old, new, k in MUTANTS:
    if only and not any(o in name for o in only):
        continue
    p = ROOT / path
    text = p.read_text()
    assert text.count(old) == 1, (name, old)
    p.write_text(text.replace(old, new))
    try:
        r = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pytest", T, "-q", "-p", "no:cacheprovider", "-k", k],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        last = [l for l in r.stdout.splitlines() if "passed" in l or "failed" in l or "error" in l][-1:]
        print(f"{name:35s} -k {k:40s} rc={r.returncode} {last}", flush=True)
    finally:
        p.write_text(text)

"""hrt_boardd --metrics-listen: a real daemon's Prometheus endpoint, scraped over HTTP(S), moves with the calls made."""
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bpuemu.board.client import BoardClient
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.board.security import TlsConfig
from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.version import __version__

from boardd_harness import clean_env, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, token: str = "", context=None) -> dict:
    """{(name, sorted labels): value} of every sample on the page."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_move_with_the_calls_made(start_daemon, rgb_model):
    port = free_port()
    d = start_daemon("--metrics-listen", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    before = scrape(url)
    assert value(before, "hrt_boardd_models_loaded") == 0
    with d.client() as fast, d.client(data_channel=False) as slow:
        sha = fast.ensure_model(rgb_model.path)
        fast.load(sha)
        for _ in range(3):
            fast.infer(sha, "", [rgb_model.x])
        assert fast._data is not None, "the data channel was not used"
        slow.infer(sha, "", [rgb_model.x], frame_count=2)
        with pytest.raises(InvalidInput):
            fast.infer(sha, "", [np.zeros(7, np.uint8)])
        with pytest.raises(NotFound):
            slow.infer("0" * 64, "", [rgb_model.x])
        slow.perf(sha, "", PerfConfig(frame_count=12))
    # A streaming call ends on the board just after its caller has read the last message.
    assert wait_until(lambda: value(scrape(url), "hrt_boardd_call_duration_seconds_count", method="Perf",
                                    transport="grpc") == 1, timeout=10)
    after = scrape(url)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("hrt_boardd_calls_total", method="Infer", transport="data", code="OK") == 3
    assert delta("hrt_boardd_calls_total", method="Infer", transport="data", code="INVALID_ARGUMENT") == 1
    assert delta("hrt_boardd_call_errors_total", method="Infer", transport="data", code="INVALID_ARGUMENT") == 1
    assert delta("hrt_boardd_calls_total", method="Infer", transport="grpc", code="OK") == 1
    assert delta("hrt_boardd_calls_total", method="Infer", transport="grpc", code="NOT_FOUND") == 1
    assert delta("hrt_boardd_call_errors_total", method="Infer", transport="grpc", code="NOT_FOUND") == 1
    assert delta("hrt_boardd_call_errors_total", method="Infer", transport="grpc", code="OK") == 0
    assert delta("hrt_boardd_calls_total", method="UploadModel", transport="grpc", code="OK") == 1
    assert delta("hrt_boardd_calls_total", method="Perf", transport="grpc", code="OK") == 1
    assert delta("hrt_boardd_call_duration_seconds_count", method="Infer", transport="data") == 4
    assert delta("hrt_boardd_call_duration_seconds_count", method="Perf", transport="grpc") == 1
    assert value(after, "hrt_boardd_call_duration_seconds_bucket", method="Perf", transport="grpc", le="+Inf") >= 1
    assert delta("hrt_boardd_frames_total", kind="infer") == 5  # 3 + 2 frames; failed calls ran none
    assert delta("hrt_boardd_frames_total", kind="perf") == 12
    assert delta("hrt_boardd_perf_jobs_total") == 1
    size = os.path.getsize(rgb_model.path)
    assert delta("hrt_boardd_upload_bytes_received_total") == size
    assert delta("hrt_boardd_uploads_total") == 1
    assert value(after, "hrt_boardd_models_loaded") == 1
    assert value(after, "hrt_boardd_loaded_model_bytes", sha256=sha) == size
    assert value(after, "hrt_boardd_store_models") == 1 and value(after, "hrt_boardd_store_bytes") == size
    assert value(after, "hrt_boardd_jobs_running", kind="perf") == 0
    assert value(after, "hrt_boardd_uploads_in_flight") == 0
    assert value(after, "process_resident_memory_bytes") > 10e6
    assert value(after, "process_open_fds") > 0 and value(after, "hrt_boardd_threads") > 1
    assert [k for k in after if k[0] == "hrt_boardd_info" and ("version", __version__) in k[1]]


def test_running_perf_and_health_checks_show(start_daemon, rgb_model):
    port = free_port()
    d = start_daemon("--metrics-listen", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        cancel = threading.Event()
        job = threading.Thread(target=lambda: pytest.raises(Exception, c.perf, sha, "",
                                                            PerfConfig(perf_time_minutes=0.5), cancel=cancel))
        job.start()
        try:
            assert wait_until(lambda: value(scrape(url), "hrt_boardd_jobs_running", kind="perf") == 1, timeout=30)
        finally:
            cancel.set()
            job.join(30)
        assert wait_until(lambda: value(scrape(url), "hrt_boardd_jobs_running", kind="perf") == 0, timeout=10)
    d.health()
    assert value(scrape(url), "hrt_boardd_calls_total", method="Check", transport="grpc", code="OK") >= 1


def test_beyond_loopback_without_a_token_is_refused_at_start(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bpuemu.board.daemon", "--listen", "127.0.0.1:0",
                           "--model-dir", str(tmp_path / "m"), "--metrics-listen", f"0.0.0.0:{free_port()}"],
                          capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0] == "ERROR refusing to serve metrics on 0.0.0.0, beyond loopback, without authentication", proc.stderr
    assert "Traceback" not in proc.stderr


def test_token_and_tls_guard_the_endpoint(start_daemon, pki, token_file):
    port = free_port()
    start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--token-file", str(token_file),
                 "--metrics-listen", f"127.0.0.1:{port}", tls=TlsConfig(ca_file=pki.ca))
    url = f"https://127.0.0.1:{port}/metrics"
    context = ssl.create_default_context(cafile=pki.ca)
    token = token_file.read_text().strip()
    assert value(scrape(url, token, context), "hrt_boardd_models_loaded") == 0
    for wrong in ("", "not-the-token-0123456789"):
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(url, wrong, context)
        assert err.value.code == 401
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        scrape(url, token, ssl.create_default_context(cafile=pki.other_ca))


def test_a_scrape_that_trickles_is_closed_by_its_deadline_and_others_are_served(start_daemon):
    """A byte every 0.3 s keeps every single read short: only a deadline for the whole scrape (10 s) ends it."""
    import select

    port = free_port()
    start_daemon("--metrics-listen", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    slow = socket.create_connection(("127.0.0.1", port), timeout=30)
    slow.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    t0 = time.monotonic()
    closed = False
    while not closed and time.monotonic() - t0 < 30:
        try:
            slow.sendall(b"a")  # the header never ends
        except OSError:
            closed = True
            break
        if select.select([slow], [], [], 0.3)[0]:
            closed = slow.recv(100) == b""
        if time.monotonic() - t0 > 2:
            assert value(scrape(url), "hrt_boardd_models_loaded") == 0  # others are served meanwhile
    elapsed = time.monotonic() - t0
    slow.close()
    assert closed and 8 < elapsed < 20, f"closed={closed} after {elapsed:.1f} s (scrape deadline 10 s)"


def test_a_metrics_server_never_started_stops_at_once():
    """stop() on an endpoint that was bound but never started (a daemon failing between the two)
    returns and frees the port; socketserver's shutdown() alone would wait forever."""
    from bpuemu.board.daemon.metrics import MetricsServer

    server = MetricsServer("127.0.0.1:0", metrics=None)
    port = server.server_address[1]
    done = threading.Event()
    threading.Thread(target=lambda: (server.stop(), done.set()), daemon=True).start()
    assert done.wait(10), "stop() blocked"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))      # the port is free again

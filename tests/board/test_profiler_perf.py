"""hrt_model_exec perf on the board: frame/time bounds, threads, profiler.log and profiler.csv.

The profiler.log format is the seed's (ptq_guide_x5, the hrt_model_exec perf
``profile_path`` example): two JSON documents separated by a ``***`` line.
"""
import csv
import io
import json
import threading

import numpy as np
import pytest

from bpuemu.board.runtime import PerfConfig, PerfReport, Runtime, run_perf
from bpuemu.board.runtime.profiler import FrameTimes, Profiler, Stat
from bpuemu.common.errors import Cancelled, InvalidInput
from bpuemu.common.proto import model_pb2

Kind = model_pb2.PlanStep
STAT_KEYS = {"avg_time", "max_time", "min_time"}
TOTAL_ROWS = ["BPU_inference_time_cost", "CPU_inference_time_cost", "TaskPendingTime", "TaskRunningTime"]


@pytest.fixture
def loaded(cpu_middle):
    rt = Runtime()
    rt.load(cpu_middle.path)
    return rt.model()


@pytest.fixture
def frame(rng):
    return [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)]


def parse_log(text: str):
    first, sep, second = text.partition("\n***\n")
    assert sep, "profiler.log has no '***' separator line"
    return json.loads(first), json.loads(second)


def check_stat(d: dict):
    assert set(d) == STAT_KEYS
    assert 0 <= d["min_time"] <= d["avg_time"] + 1e-12
    assert d["avg_time"] <= d["max_time"] + 1e-12


@pytest.mark.parametrize("threads", [1, 3])
def test_profile_log_has_the_seed_format(loaded, frame, cpu_middle, threads):
    report = run_perf(loaded, frame, PerfConfig(frame_count=12, thread_num=threads, core_id=0, profile=True))
    assert isinstance(report, PerfReport)
    assert report.profiler_log.count("\n***\n") == 1
    first, second = parse_log(report.profiler_log)

    assert set(first) == {"perf_result", "running_condition"}
    assert set(first["perf_result"]) == {"FPS", "average_latency"}
    assert set(first["running_condition"]) == {"core_id", "frame_count", "model_name", "run_time", "thread_num"}
    rc = first["running_condition"]
    assert rc == {"core_id": 0, "frame_count": 12, "model_name": "cpu_middle",
                  "run_time": pytest.approx(report.run_time_ms), "thread_num": threads}
    assert first["perf_result"]["FPS"] == pytest.approx(report.fps)
    assert first["perf_result"]["average_latency"] == pytest.approx(report.average_latency_ms)

    assert set(second) == {"processor_latency", "model_latency", "task_latency"}
    assert set(second["processor_latency"]) == {"BPU_inference_time_cost", "CPU_inference_time_cost"}
    assert set(second["task_latency"]) == {"TaskPendingTime", "TaskRunningTime"}
    names = set(cpu_middle.step_names())
    assert set(second["model_latency"]) == names
    assert {"Preprocess", "BPU_cpu_middle_subgraph_0", "BPU_cpu_middle_subgraph_1", "Softmax_mid",
            "cpu_middle_subgraph_0_output_layout_convert", "y_DequantizeLinear_HzDequantize"} <= names
    for d in list(second["model_latency"].values()) + list(second["processor_latency"].values()) \
            + list(second["task_latency"].values()):
        check_stat(d)

    # BPU time is the BPU subgraphs' time; CPU time everything else; running time both.
    bpu_steps = {s.name for s in cpu_middle.model.plan if s.kind == Kind.BPU_SUBGRAPH}
    ml = second["model_latency"]
    bpu = second["processor_latency"]["BPU_inference_time_cost"]["avg_time"]
    cpu = second["processor_latency"]["CPU_inference_time_cost"]["avg_time"]
    assert bpu == pytest.approx(sum(ml[n]["avg_time"] for n in bpu_steps), rel=1e-6)
    assert cpu == pytest.approx(sum(ml[n]["avg_time"] for n in names - bpu_steps), rel=1e-6)
    assert second["task_latency"]["TaskRunningTime"]["avg_time"] == pytest.approx(bpu + cpu, rel=1e-6)
    assert bpu > 0 and cpu > 0


def test_model_latency_keys_are_sorted_like_the_seed(loaded, frame):
    report = run_perf(loaded, frame, PerfConfig(frame_count=2, profile=True))
    _, second = parse_log(report.profiler_log)
    keys = list(second["model_latency"])
    assert keys == sorted(keys)


def test_profile_csv_has_one_row_per_step_and_the_totals(loaded, frame, cpu_middle):
    report = run_perf(loaded, frame, PerfConfig(frame_count=7, thread_num=2, profile=True))
    rows = list(csv.reader(io.StringIO(report.profiler_csv)))
    assert rows[0] == ["name", "processor", "count", "avg_time_ms", "max_time_ms", "min_time_ms"]
    body = rows[1:]
    names = [r[0] for r in body]
    # Steps in execution order (one row per name: "Preprocess" may repeat in the plan), then totals.
    unique_steps = list(dict.fromkeys(cpu_middle.step_names()))
    assert names == unique_steps + TOTAL_ROWS
    by_name = {r[0]: r for r in body}
    assert by_name["BPU_cpu_middle_subgraph_0"][1] == "BPU"
    assert by_name["Softmax_mid"][1] == "CPU"
    for r in body:
        assert int(r[2]) == 7
        mn, avg, mx = float(r[5]), float(r[3]), float(r[4])
        assert mn <= avg <= mx


def test_frame_count_is_honoured(loaded, frame):
    for threads, count in ((1, 5), (4, 9)):
        report = run_perf(loaded, frame, PerfConfig(frame_count=count, thread_num=threads))
        assert report.frame_count == count
        assert report.thread_num == threads
        assert report.fps > 0 and report.run_time_ms > 0
        assert report.average_latency_ms == pytest.approx(report.total_latency_ms / count)
        assert report.p50_ms <= report.p90_ms <= report.p99_ms
        assert report.profiler_log == "" and report.profiler_csv == ""


def test_perf_time_stops_by_time(loaded, frame):
    minutes = 0.002  # 120 ms
    report = run_perf(loaded, frame, PerfConfig(frame_count=1, perf_time_minutes=minutes, thread_num=2, profile=True))
    assert report.run_time_ms >= minutes * 60e3
    assert report.run_time_ms < minutes * 60e3 + 5000
    # frame_count does not bound a timed run.
    assert report.frame_count > 1
    first, _ = parse_log(report.profiler_log)
    assert first["running_condition"]["frame_count"] == report.frame_count


@pytest.mark.parametrize("threads", [0, 9, -1])
def test_thread_num_outside_1_to_8_is_refused(loaded, frame, threads):
    with pytest.raises(InvalidInput, match=r"thread_num must be in \[1,8\]"):
        run_perf(loaded, frame, PerfConfig(frame_count=1, thread_num=threads))


@pytest.mark.parametrize(
    "config, message",
    [
        (PerfConfig(frame_count=0), "frame_count must be >= 1"),
        (PerfConfig(perf_time_minutes=-1), "perf_time must be >= 0"),
        (PerfConfig(core_id=-1), "core_id must be >= 0"),
    ],
)
def test_bad_perf_config_is_refused(loaded, frame, config, message):
    with pytest.raises(InvalidInput, match=message):
        run_perf(loaded, frame, config)


def test_board_limits_are_enforced():
    with pytest.raises(InvalidInput, match="over this board's limit of 100"):
        PerfConfig(frame_count=101).validate(max_frame_count=100)
    with pytest.raises(InvalidInput, match="over this board's limit"):
        PerfConfig(perf_time_minutes=2).validate(max_perf_time_minutes=1)
    PerfConfig(frame_count=100).validate(max_frame_count=100)


def test_cancelled_callback_stops_the_job(loaded, frame):
    calls = []

    def cancelled():
        calls.append(1)
        return True

    # Enough frames for seconds of work (so a cancel that is ignored fails the test, not hangs it).
    with pytest.raises(Cancelled, match="cancelled after"):
        run_perf(loaded, frame, PerfConfig(frame_count=20000, thread_num=2), cancelled=cancelled, progress_interval_s=0.01)
    assert calls
    # The workers were told to stop: no perf thread is left running.
    assert not [t for t in threading.enumerate() if t.name.startswith("perf-")]


def test_ctrl_c_lets_every_worker_finish_its_frame_first(loaded, frame):
    """Ctrl-C while perf runs: no worker may still be inside onnxruntime when the process exits
    (hrt_model_exec perf then aborted with "terminate called without an active exception")."""
    def ctrl_c(done, total, elapsed):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_perf(loaded, frame, PerfConfig(frame_count=20000, thread_num=2), progress=ctrl_c, progress_interval_s=0.01)
    assert not [t for t in threading.enumerate() if t.name.startswith("perf-")]


def test_progress_is_reported(loaded, frame):
    seen = []
    run_perf(loaded, frame, PerfConfig(frame_count=40), progress=lambda d, t, s: seen.append((d, t, s)),
             progress_interval_s=0.001)
    assert seen
    assert all(t == 40 for _, t, _ in seen)
    done = [d for d, _, _ in seen]
    assert done == sorted(done) and done[-1] == 40
    elapsed = [e for _, _, e in seen]
    assert elapsed == sorted(elapsed)


class _GatedModel:
    """A LoadedModel whose frames wait for ``go``; counts the frames run."""

    def __init__(self, model):
        self.model, self.name = model, model.name
        self.go = threading.Event()
        self.runs = 0
        self._lock = threading.Lock()

    def run(self, *args, **kwargs):
        self.go.wait(10)
        out = self.model.run(*args, **kwargs)
        with self._lock:
            self.runs += 1
        return out


@pytest.mark.parametrize("threads", [1, 2])
def test_the_last_progress_report_is_the_final_count(loaded, frame, threads):
    """Even when every frame ends between two ticks, the caller hears 'N of N'."""
    gated = _GatedModel(loaded)
    seen = []

    def progress(done, total, elapsed):
        seen.append((done, total))
        if len(seen) == 1:  # first tick: let the frames run, and wait until all are done
            gated.go.set()
            for _ in range(1000):
                if gated.runs == 3:
                    break
                threading.Event().wait(0.01)
            threading.Event().wait(0.05)  # the workers return after their last frame

    run_perf(gated, frame, PerfConfig(frame_count=3, thread_num=threads), progress=progress, progress_interval_s=0.01)
    assert seen[0] == (0, 3)
    assert seen[-1] == (3, 3)


def test_timed_job_reports_progress_with_total_zero(loaded, frame):
    seen = []
    report = run_perf(loaded, frame, PerfConfig(perf_time_minutes=0.0005), progress=lambda d, t, s: seen.append((d, t)))
    assert seen[-1] == (report.frame_count, 0)


def test_errors_in_workers_reach_the_caller(loaded):
    with pytest.raises(InvalidInput, match="must be float32"):
        run_perf(loaded, [np.zeros((1, 3, 16, 16), np.float64)], PerfConfig(frame_count=3, thread_num=2))


def test_console_block(loaded, frame):
    text = run_perf(loaded, frame, PerfConfig(frame_count=3, thread_num=2)).console()
    lines = text.splitlines()
    assert "Running condition:" in lines and "Perf result:" in lines
    assert "  Thread number is: 2" in lines
    assert "  Frame count   is: 3" in lines
    assert any(line.startswith("  Frame      rate       is:") and line.endswith(" FPS") for line in lines)
    assert any(line.startswith("  Average    latency    is:") for line in lines)
    assert any(line.startswith("  Frame totally latency is:") for line in lines)
    assert any(line.startswith("  Program run time:") for line in lines)


# --- the profiler itself, with known times -----------------------------------------------

def test_stat_and_profiler_arithmetic():
    s = Stat()
    assert s.as_dict() == {"avg_time": 0.0, "max_time": 0.0, "min_time": 0.0}
    for ms in (3.0, 1.0, 2.0):
        s.add(ms)
    assert s.as_dict() == {"avg_time": 2.0, "max_time": 3.0, "min_time": 1.0}
    other = Stat()
    other.add(10.0)
    s.merge(other)
    assert s.as_dict() == {"avg_time": 4.0, "max_time": 10.0, "min_time": 1.0}

    p = Profiler()
    p.add_frame(FrameTimes(steps=[("Preprocess", False, 1.0), ("BPU_m_subgraph_0", True, 4.0), ("Softmax", False, 2.0)],
                           pending_ms=0.5, running_ms=7.0))
    p.add_frame(FrameTimes(steps=[("Preprocess", False, 3.0), ("BPU_m_subgraph_0", True, 6.0), ("Softmax", False, 2.0)],
                           pending_ms=1.5, running_ms=11.0))
    doc = p.second_document()
    assert doc["processor_latency"]["BPU_inference_time_cost"] == {"avg_time": 5.0, "max_time": 6.0, "min_time": 4.0}
    assert doc["processor_latency"]["CPU_inference_time_cost"] == {"avg_time": 4.0, "max_time": 5.0, "min_time": 3.0}
    assert doc["model_latency"]["Preprocess"] == {"avg_time": 2.0, "max_time": 3.0, "min_time": 1.0}
    assert doc["task_latency"]["TaskPendingTime"] == {"avg_time": 1.0, "max_time": 1.5, "min_time": 0.5}
    assert doc["task_latency"]["TaskRunningTime"] == {"avg_time": 9.0, "max_time": 11.0, "min_time": 7.0}
    rows = list(csv.reader(io.StringIO(p.profiler_csv())))
    assert rows[1] == ["Preprocess", "CPU", "2", "2.000000", "3.000000", "1.000000"]
    assert rows[2][:2] == ["BPU_m_subgraph_0", "BPU"]
    first, second = parse_log(p.profiler_log({"FPS": 1.0, "average_latency": 2.0}, {"model_name": "m"}))
    assert first == {"perf_result": {"FPS": 1.0, "average_latency": 2.0}, "running_condition": {"model_name": "m"}}
    assert second == doc

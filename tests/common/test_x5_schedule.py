"""bpuemu.common.x5_timing: a model's stored X5 step times scheduled on one BPU core and eight A55 cores."""
import threading
import time

import pytest

from bpuemu.common import x5_timing as xt
from bpuemu.common.proto import model_pb2


def steps(*segments, overhead=0.0):
    """ModelSteps from ("B"|"C", us) pairs."""
    return xt.ModelSteps("m", tuple(xt.StepTime(f"s{i}", kind == "B", us) for i, (kind, us) in enumerate(segments)),
                         overhead)


def test_one_thread_is_the_sum_of_the_steps():
    m = steps(("C", 100.0), ("B", 1000.0), ("C", 300.0), ("B", 500.0), overhead=50.0)
    run = xt.schedule(m, thread_num=1, frame_count=50)
    assert run.latency_ms == pytest.approx(1.95) and run.latency_1thread_ms == pytest.approx(1.95)
    assert run.fps == pytest.approx(1e3 / 1.95)
    assert (run.bpu_ms, run.cpu_ms) == (pytest.approx(1.5), pytest.approx(0.45))


def test_several_threads_are_bounded_by_the_one_bpu():
    m = steps(("C", 100.0), ("B", 4000.0), ("C", 3000.0))      # YOLOv8n-like: 4 ms BPU, 3 ms CPU after it
    two = xt.schedule(m, thread_num=2, frame_count=2000)
    assert two.fps == pytest.approx(250.0, rel=0.01)          # the BPU busy all the time: 1 / 4 ms
    assert two.latency_ms == pytest.approx(2 / 250.0 * 1e3, rel=0.02)   # latency = threads / FPS
    eight = xt.schedule(m, thread_num=8, frame_count=2000)
    assert eight.fps == pytest.approx(250.0, rel=0.01) and eight.latency_ms > two.latency_ms


def test_cpu_steps_of_different_threads_overlap():
    m = steps(("C", 3000.0), ("B", 1000.0))                     # CPU-bound: 3 ms CPU, 1 ms BPU per frame
    one, three, eight = (xt.schedule(m, n, 3000) for n in (1, 3, 8))
    assert one.fps == pytest.approx(250.0)
    assert three.fps == pytest.approx(3 * 250.0, rel=0.01)      # three cores work at once
    assert eight.fps == pytest.approx(1000.0, rel=0.01)         # until the BPU is the bottleneck


def test_fps_grows_with_threads_up_to_the_bpu_bound():
    m = steps(("C", 700.0), ("B", 2200.0), ("C", 50.0), overhead=200.0)
    fps = [xt.schedule(m, n, 500).fps for n in range(1, 9)]
    assert all(b >= a * 0.999 for a, b in zip(fps, fps[1:]))
    assert fps[-1] <= 1e6 / 2200.0 * 1.0001


def test_thread_num_outside_the_board_is_refused():
    with pytest.raises(ValueError):
        xt.schedule(steps(("B", 1.0)), thread_num=9)


def test_a_model_without_timing_says_rebuild():
    old = model_pb2.Model(name="old")
    old.plan.add(kind=model_pb2.PlanStep.BPU_SUBGRAPH, name="BPU_old_subgraph_0")
    assert not xt.has_timing(old)
    with pytest.raises(xt.NoX5Timing) as exc:
        xt.plan_steps(old)
    assert str(exc.value).startswith("model 'old': no X5 timing in this model, rebuild with makertbin")


def test_stored_times_are_read_back_with_their_processors():
    m = model_pb2.Model(name="m")
    k = model_pb2.PlanStep
    m.plan.add(kind=k.PREPROCESS, name="Preprocess", fused_into_subgraph=True, x5_us=12.0)
    m.plan.add(kind=k.BPU_SUBGRAPH, name="BPU_m_subgraph_0", x5_us=900.0)
    m.plan.add(kind=k.DEQUANTIZE, name="y_HzDequantize", x5_us=80.0)
    m.x5_timing.task_overhead_us = 150.0
    m.x5_timing.ddr_bytes = 4096
    s = xt.plan_steps(m)
    assert [(t.on_bpu, t.us) for t in s.steps] == [(True, 12.0), (True, 900.0), (False, 80.0)]
    assert s.bpu_us == 912.0 and s.cpu_us == 230.0
    assert xt.estimate_line(m) == "FPS=1096.49, latency = 912.0 us, DDR = 4096 bytes"


def test_the_wall_clock_shares_one_bpu_between_threads():
    """X5Clock: two threads each asking for 30 ms of BPU per frame get one frame per 30 ms between them."""
    m = steps(("B", 30000.0))
    clock = xt.X5Clock()
    ends = []

    def worker():
        for _ in range(3):
            start = time.perf_counter_ns()
            clock.wait_until(clock.deadline_ns(m, start))
            ends.append(time.perf_counter_ns())

    t0 = time.perf_counter_ns()
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ends) == 6
    elapsed_ms = (max(ends) - t0) / 1e6
    assert 6 * 30 <= elapsed_ms < 6 * 30 + 60                  # serialized: six frames of 30 ms

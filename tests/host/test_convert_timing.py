"""Where a conversion's time goes: makertbin's stage clock (bpuemu.host.quant.stages)."""
import logging
import time

from bpuemu.host.mapper.makertbin import makertbin_from_config
from bpuemu.host.quant.stages import STAGES, StageClock
from bpuemu.host.samples import write_sample_project


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_stage_clock_counts_a_nested_stage_once_in_the_inner_stage():
    clock = StageClock()
    with clock.stage("search"):
        _busy(0.05)
        with clock.stage("statistics"):
            _busy(0.1)
        time.sleep(0.05)                 # wall, no CPU
    times = clock.times((1.0, 0.5))
    assert list(times) == list(STAGES)
    (sw, sc), (tw, tc) = times["search"], times["statistics"]
    # wall only from below (a loaded machine stretches it); CPU, this process's own, from both sides:
    # the inner stage's CPU is not counted again in the outer one
    assert tw >= 0.1 and 0.1 <= tc < 0.15, times
    assert sw >= 0.1 and 0.05 <= sc < 0.08, times
    assert times["cosine table"] == (0.0, 0.0)
    rest = times["the rest"]
    assert abs(rest[0] - (1.0 - sw - tw)) < 1e-9 and abs(rest[1] - (0.5 - sc - tc)) < 1e-9


DELAY_S = 0.5


def test_makertbin_puts_a_known_delay_in_its_named_stage(tmp_path, monkeypatch, caplog):
    """A real conversion (statistics computed, not cached) with a known delay added inside two of
    its steps: DELAY_S of CPU in the statistics (cached_statistics) and DELAY_S of sleep in the
    cosine table (_report_accuracy). Each lands in the stage named after its step, as wall (and,
    for the CPU, CPU) time; every stage is reported, in makertbin's order."""
    from bpuemu.host.convert import pipeline
    from bpuemu.host.quant import api

    def burning(fn):
        def wrapped(*args, **kwargs):
            _busy(DELAY_S)
            return fn(*args, **kwargs)
        return wrapped

    def sleeping(fn):
        def wrapped(*args, **kwargs):
            time.sleep(DELAY_S)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(api, "cached_statistics", burning(api.cached_statistics))
    monkeypatch.setattr(pipeline, "_report_accuracy", sleeping(pipeline._report_accuracy))
    monkeypatch.setenv("BPUEMU_CALIBRATION_CACHE", "off")
    cfg = write_sample_project(str(tmp_path / "s"), 64, "rgb", samples=8)
    with caplog.at_level(logging.INFO):
        art = makertbin_from_config(cfg)
    assert list(art.stages) == list(STAGES)
    statistics_wall, statistics_cpu = art.stages["statistics"]
    assert statistics_wall >= DELAY_S and statistics_cpu >= DELAY_S, art.stages
    cosine_wall, cosine_cpu = art.stages["cosine table"]
    assert cosine_wall >= DELAY_S, art.stages
    # the sleep is no CPU: the cosine table's CPU is its own work, well below its wall with the sleep in it
    assert cosine_cpu < cosine_wall, art.stages
    for name in ("search", "emit/compile"):
        assert art.stages[name][0] > 0, (name, art.stages)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("time by stage: "))
    assert line.startswith("time by stage: statistics ") and ", the rest " in line, line

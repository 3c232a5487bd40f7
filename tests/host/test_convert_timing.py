"""Where a conversion's time goes: makertbin's stage clock (bpuemu.host.quant.stages)."""
import logging
import re
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
    assert 0.1 <= tw < 0.15 and 0.1 <= tc < 0.15, times
    assert 0.1 <= sw < 0.15 and 0.05 <= sc < 0.08, times
    assert times["cosine table"] == (0.0, 0.0)
    rest = times["the rest"]
    assert abs(rest[0] - (1.0 - sw - tw)) < 1e-9 and abs(rest[1] - (0.5 - sc - tc)) < 1e-9


def test_makertbin_reports_each_stage_of_the_run(tmp_path, monkeypatch, caplog):
    """Every stage of a real conversion (statistics computed, not cached) took time, in the
    order makertbin reports them, and they add up to the run's own wall time."""
    monkeypatch.setenv("BPUEMU_CALIBRATION_CACHE", "off")
    cfg = write_sample_project(str(tmp_path / "s"), 64, "rgb", samples=8)
    with caplog.at_level(logging.INFO):
        art = makertbin_from_config(cfg)
    assert list(art.stages) == list(STAGES)
    for name, (wall, cpu) in art.stages.items():
        assert wall > 0 and cpu > 0, (name, art.stages)
    total = float(re.search(r"End Model Convert \(([\d.]+) s\)", caplog.text).group(1))
    assert abs(sum(w for w, _ in art.stages.values()) - total) < 0.06, (total, art.stages)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("time by stage: "))
    assert line.startswith("time by stage: statistics ") and ", the rest " in line, line

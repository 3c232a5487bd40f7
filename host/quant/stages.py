"""Where a conversion's time goes: wall and CPU seconds per stage.

makertbin times its stages with one ``StageClock`` (``calibrate`` the
statistics and the search, the pipeline the cosine table and the emitting and
compiling of the artifacts, everything else is "the rest"), logs them in one
line and returns them in ``Artifacts.stages``; bench/convert.py prints them
beside its ratios. CPU seconds are the whole process's (every thread's), so a
stage's CPU over its wall time says how many of the cores it kept busy.

A stage entered inside another one is counted once, in the inner one: the
outer stage's figures are its own time without the inner stages'.
"""
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple

#: The stages makertbin reports, in its order ("the rest" is the run's total less the others).
STAGES = ("statistics", "search", "cosine table", "emit/compile", "the rest")


class StageClock:
    """Wall and process CPU seconds summed per stage name (``stage``), nested stages exclusive."""

    def __init__(self) -> None:
        self._times: Dict[str, List[float]] = {}
        self._open: List[List[float]] = []          # per open stage: the wall and CPU of the stages inside it

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        inner = [0.0, 0.0]
        self._open.append(inner)
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            self._open.pop()
            if self._open:
                self._open[-1][0] += wall
                self._open[-1][1] += cpu
            mine = self._times.setdefault(name, [0.0, 0.0])
            mine[0] += wall - inner[0]
            mine[1] += cpu - inner[1]

    def times(self, total: Tuple[float, float]) -> Dict[str, Tuple[float, float]]:
        """(wall, CPU) seconds of each of ``STAGES`` (0 for one never entered), "the rest" being
        ``total`` (the whole run's wall and CPU) less the others; then any other stage timed."""
        out = {name: tuple(self._times.get(name, (0.0, 0.0))) for name in STAGES if name != "the rest"}
        out.update({name: tuple(v) for name, v in self._times.items() if name not in out})
        out["the rest"] = (max(0.0, total[0] - sum(w for w, _ in out.values())),
                           max(0.0, total[1] - sum(c for _, c in out.values())))
        return {name: out[name] for name in list(STAGES) + [n for n in out if n not in STAGES]}


def stages_line(stages: Dict[str, Tuple[float, float]]) -> str:
    """``statistics 0.3 s (CPU 0.3 s), search ...``: what makertbin logs and the bench prints."""
    return ", ".join(f"{name} {wall:.2f} s (CPU {cpu:.2f} s)" for name, (wall, cpu) in stages.items())

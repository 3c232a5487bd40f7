"""hrt_model_exec on several boards (``--board a:p,b:p`` or ``--board @boards.txt``).

perf runs on every board at once and prints each board's block, then a table
of all boards and their aggregate (bpuemu.board.farm). infer and model_info
run on every board and print each board's result; infer also says whether the
boards' outputs agree bit for bit. A board that fails is one row ("FAILED")
in the table and is named in the one ERROR line; the other boards' results
are printed all the same, and the exit status is 1.
"""
import os
import threading
from typing import Callable, List, Sequence

import click
import numpy as np

from bpuemu.board.farm import BoardAccess, BoardOutcome, failures_line, fan_out, farm_perf, profile_dir, summarize
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.common.atomic import write_file_atomic


def _raise_if_failed(what: str, outcomes: Sequence[BoardOutcome]) -> None:
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise type(failed[0].error)(failures_line(what, outcomes))


def _header(target: str, description: str) -> str:
    return f"=== board {target} ({description}) ==="


def model_info(boards: List[str], model_files: List[str], model_name: str, access: BoardAccess) -> None:
    from bpuemu.board.cli.hrt_model_exec_text import model_info_text

    def one(target):
        with access.backend(target, model_files) as be:
            handles = [be.model(model_name)] if model_name else [be.models[n] for n in be.model_names]
            return model_info_text([h.model for h in handles], be.description, be.load_ms)

    outcomes = fan_out(boards, one)
    for o in outcomes:
        if o.ok:
            click.echo(f"=== board {o.target} ===\n{o.value}")
    _raise_if_failed("model_info", outcomes)


def infer(boards: List[str], model_files: List[str], model_name: str, access: BoardAccess,
          read_inputs: Callable, frame_count: int, dump_intermediate: bool, dump_outputs: Callable) -> None:
    """``read_inputs(handle) -> inputs``; ``dump_outputs(target, handle, result) -> files written``."""
    from bpuemu.board.cli.hrt_model_exec_text import infer_text

    def one(target):
        with access.backend(target, model_files) as be:
            h = be.model(model_name)
            result = h.infer(read_inputs(h), frame_count=frame_count, dump_intermediate=dump_intermediate)
            written = dump_outputs(target, h, result)
            info = be.client.info
            return f"{info.arch}, bpuemu {info.daemon_version}", h.name, result, written

    outcomes = fan_out(boards, one)
    ok = [o for o in outcomes if o.ok]
    for o in ok:
        description, name, result, written = o.value
        click.echo(_header(o.target, description))
        click.echo(infer_text(name, result.outputs, result.latency_ms))
        if written:
            click.echo(f"dumped {len(written)} file(s) to {os.path.dirname(os.path.abspath(written[0]))}")
    if len(ok) > 1:
        first = ok[0].value[2].outputs
        differ = [o.target for o in ok[1:]
                  if list(o.value[2].outputs) != list(first)
                  or not all(np.array_equal(o.value[2].outputs[n], first[n]) for n in first)]
        if differ:
            click.echo(f"outputs differ from board {ok[0].target} on: {', '.join(differ)}")
        elif len(ok) == len(outcomes):
            click.echo(f"outputs identical on all {len(ok)} boards")
        else:
            click.echo(f"outputs identical on the {len(ok)} boards that answered")
    _raise_if_failed("infer", outcomes)


class _FarmProgress:
    """Sums the boards' progress for one bar: ``bar(done, total, elapsed)``."""

    def __init__(self, bar):
        self.bar = bar
        self.done = {}
        self.lock = threading.Lock()

    def __call__(self, target, done, total, elapsed):
        with self.lock:
            self.done[target] = done
            self.bar(sum(self.done.values()), total, elapsed)


def perf(boards: List[str], model_files: List[str], model_name: str, access: BoardAccess, config: PerfConfig,
         read_inputs: Callable, progress_bar, profile_path: str) -> None:
    from bpuemu.board.cli.hrt_model_exec_text import farm_perf_text

    with progress_bar(config.frame_count * len(boards) if config.perf_time_minutes == 0 else 0) as bar:
        outcomes = farm_perf(boards, model_files, model_name, config, read_inputs, access, progress=_FarmProgress(bar))
    for o in outcomes:
        if o.ok:
            click.echo(_header(o.target, o.value.description))
            click.echo(o.value.report.console())
    click.echo(farm_perf_text(outcomes, summarize(outcomes)))
    if profile_path:
        for o in outcomes:
            if o.ok:
                directory = profile_dir(profile_path, o.target)
                os.makedirs(directory, exist_ok=True)
                for name, text in (("profiler.log", o.value.report.profiler_log), ("profiler.csv", o.value.report.profiler_csv)):
                    write_file_atomic(os.path.join(directory, name), text)
        click.echo(f"profiler data written to {os.path.abspath(profile_path)}/<board>/profiler.log and profiler.csv")
    _raise_if_failed("perf", outcomes)

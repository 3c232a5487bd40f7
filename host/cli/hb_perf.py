"""hb_perf BIN_FILE [-m NAME] [-p] [--compare profiler.log]"""
import os

import click

from bpuemu.common.errors import InvalidInput
from bpuemu.host.cli import log, model_name_option, run, setup_logging, version_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bin_file", type=click.Path(dir_okay=False))
@model_name_option
@click.option("-p", "packed", is_flag=True, help="BIN_FILE is a packed model (hb_pack).")
@click.option("--compare", "profiler_log", default="", metavar="PROFILER_LOG",
              help="profiler.log from 'hrt_model_exec perf --profile_path': print estimate vs measured per subgraph.")
@click.option("--ddr-bandwidth", "ddr_gbps", default=None, type=click.FloatRange(min=0.001), metavar="GB/S",
              help="DDR bandwidth of the X5 timing model (default: the fitted value; see the report's parameter table).")
@version_option("hb_perf")
def cli(bin_file, model_name, packed, profiler_log, ddr_gbps):
    """Estimate the performance of a hybrid model (*.bin) and write hb_perf_result/<model>/."""
    from bpuemu.common.container import read_bin
    from bpuemu.host.tools import static_perf as perf
    from bpuemu.host.tools.static_perf.compare import compare, compare_text, profiler_log_for, read_profiler_file

    setup_logging()
    binfile = read_bin(bin_file)
    if binfile.manifest.packed and not packed:
        log.warning("%s is a packed model; analysing it as with -p", bin_file)
    if packed and not binfile.manifest.packed:
        log.warning("%s is not a packed model; -p ignored", bin_file)
    bpu = perf.X5_BPU if ddr_gbps is None else perf.X5_BPU.with_ddr_bandwidth(ddr_gbps)
    models = [binfile.model(model_name)] if model_name else list(binfile.manifest.models)
    if profiler_log and len(models) != 1:
        raise InvalidInput(f"{bin_file} holds {len(models)} models; pick the one profiler.log measured with -m NAME")
    text = read_profiler_file(profiler_log) if profiler_log else ""
    if text:  # checked before anything is written or printed
        profiler_log_for(models[0].name, text, profiler_log)
    for m in models:
        if not perf.is_debug_build(m):
            log.warning("bpu model don't have per-layer perf info.")
            log.warning("if you need per-layer perf info please enable[compiler_parameters.debug:True] when use makertbin.")
        files = perf.analyze(binfile, perf.RESULT_DIR, m.name, bpu)[0]
        est = files.estimate
        log.info("%s: %s", m.name, est.strategy.describe())
        of_x5 = " (the X5 timing model's; the J6 line below scales it)" if _is_j6(m) else ""
        log.info("%s: %s%s", m.name, est.line(), of_x5)
        one = est.modeled(1)
        log.info("%s: one frame with one thread on the X5: %.3f ms (BPU %.3f ms + CPU %.3f ms)%s", m.name,
                 one.latency_1thread_ms, one.bpu_ms, one.cpu_ms, of_x5)
        _j6_line(m)
        _check_stored(m, est, ddr_gbps)
        log.info("%s: performance report written to %s", m.name, os.path.abspath(files.html))
        if profiler_log:
            click.echo(compare_text(compare(est, text, profiler_log)))


def _is_j6(model) -> bool:
    from bpuemu.common.march import MARCHES

    return model.march in MARCHES and MARCHES[model.march].is_j6


def _j6_line(model) -> None:
    """A J6 model's frame on its march: the stored X5 times scaled per the march (bpuemu.common.x5_timing.
    march_steps), with what that rests on (March.timing.label: modeled and assumed, no board measurements)."""
    from bpuemu.common import x5_timing
    from bpuemu.common.march import march

    m = march(model.march or None)
    if not m.is_j6 or not x5_timing.has_timing(model):
        return
    one = x5_timing.schedule(x5_timing.march_steps(model), 1, 1)
    log.info("%s: one frame with one thread on %s (%s): %.3f ms (BPU %.3f ms + CPU %.3f ms) [%s]", model.name, m.name,
             m.platform, one.latency_1thread_ms, one.bpu_ms, one.cpu_ms, m.timing.label)


def _check_stored(model, est, ddr_gbps) -> None:
    """A WARNING when the .bin's stored X5 timing (what hrt_model_exec perf shows) differs from this estimate."""
    from bpuemu.common import x5_timing

    if not x5_timing.has_timing(model):
        log.warning("%s: %s (hrt_model_exec perf shows no X5 figures for it)", model.name, x5_timing.NO_TIMING)
        return
    stored = x5_timing.estimate_line(model, on_march=False)
    if stored != est.line() and ddr_gbps is None:
        log.warning("%s: the .bin stores the X5 timing of another parameter set (%s: %s); rebuild with makertbin "
                    "for hrt_model_exec perf to show this estimate", model.name, model.x5_timing.parameters, stored)


def main(args=None):
    run(cli, "hb_perf", args, hints={"model_name": "pick the model with -m NAME"})


if __name__ == "__main__":
    main()

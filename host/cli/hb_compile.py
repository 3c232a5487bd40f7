"""hb_compile: the J6 conversion command (ptq_faq_j6), a thin edge over bpuemu.host.mapper.hb_compile.

    hb_compile --config config.yaml                       (or -c; the march from the yaml)
    hb_compile --fast-perf --model m.onnx --march nash-e [--input-shape data 1x3x224x224]
    hb_compile --fast-perf --proto m.prototxt --model m.caffemodel --march nash-p

Logs to the console and to hb_compile.log in the current directory; a user
error is one ERROR line (also in the log) and a non-zero exit.
"""
import logging

import click

from bpuemu.board.cli.edge import print_error
from bpuemu.common.march import J6_MARCHES
from bpuemu.common.version import __version__
from bpuemu.host.cli import run, setup_logging, version_option

log = logging.getLogger("bpuemu.host")
LOG_FILE = "hb_compile.log"
_STARTED = {}


def _report(lines) -> None:
    if not _STARTED:
        print_error(lines)
        return
    for line in lines:
        log.error(line)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hb_compile")
@click.option("-c", "--config", "config_path", default="", help="The conversion yaml.")
@click.option("--fast-perf", is_flag=True, help="Build for best performance with built-in settings (no --config).")
@click.option("-m", "--model", "model_path", default="", help="With --fast-perf: the float ONNX model or Caffe caffemodel.")
@click.option("--proto", default="", help="With --fast-perf and a Caffe --model: the prototxt.")
@click.option("--march", default="", help=f"With --fast-perf: {', '.join(J6_MARCHES)}.")
@click.option("-i", "--input-shape", "input_shapes", type=(str, str), multiple=True, metavar="NAME SHAPE",
              help="With --fast-perf: an input's shape, once per input.")
def cli(config_path, fast_perf, model_path, proto, march, input_shapes):
    """J6 model conversion (emulated by bpuemu): float model -> .bc, .hbm and the ONNX artifacts."""
    setup_logging("INFO", log_file=LOG_FILE)
    _STARTED["yes"] = True
    from bpuemu.host.mapper.checker import parse_shape
    from bpuemu.host.mapper.hb_compile import compile_fast_perf, compile_from_config

    log.info("Start hb_compile....")
    log.info("hb_compile version %s", __version__)
    if fast_perf:
        if config_path:
            raise click.UsageError("--fast-perf uses built-in settings; do not give --config")
        if not model_path or not march:
            raise click.UsageError(f"--fast-perf needs --model FILE and --march ({', '.join(J6_MARCHES)})")
        shapes = {name: parse_shape(shape) for name, shape in input_shapes}
        result = compile_fast_perf(model_path, march, shapes, prototxt=proto)
    else:
        if not config_path:
            raise click.UsageError("give --config FILE.yaml (or --fast-perf --model FILE --march MARCH)")
        if march or model_path or proto or input_shapes:
            raise click.UsageError("--march, --model, --proto and --input-shape go with --fast-perf; "
                                   "with --config the yaml gives them")
        result = compile_from_config(config_path)
    log.info("output: %s", result.bin)


def main(args=None):
    run(cli, "hb_compile", args, report=_report)


if __name__ == "__main__":
    main()

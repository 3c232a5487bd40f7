"""hb_mapper: checker | makertbin | infer (the seeds' commands and flags).

    hb_mapper checker --model-type onnx --march bayes-e --model m.onnx [--input-shape data 1x3x224x224]
    hb_mapper makertbin --config m.yaml --model-type onnx
    hb_mapper makertbin --fast-perf --model m.onnx --model-type onnx --march bayes-e [-i data 1x3x224x224]
    hb_mapper infer --config m.yaml --model-file m_quantized_model.onnx --model-type onnx \
                    --image-file data img.bin --input-layout NCHW --output-dir out/

Every subcommand logs to the console and to hb_mapper_<subcommand>.log in the
current directory. Errors end with "exception in command: <subcommand>" and a
non-zero exit.
"""
import logging

import click

from bpuemu.common.version import __version__
from bpuemu.board.cli.edge import print_error
from bpuemu.host.cli import run, setup_logging, version_option

log = logging.getLogger("bpuemu.host")

#: Hints in hb_mapper's own flags for library errors about a subject (see bpuemu.board.cli.edge).
HINTS = {"input_shape": "give it with --input-shape NAME 1x3x224x224 (NAME: the input named above), "
                        "or input_shape in the yaml"}


#: The subcommand being run, for the seed's "exception in command: <subcommand>" line.
_RUNNING = {}


def _logging(subcommand: str) -> None:
    """Console and hb_mapper_<subcommand>.log, in the seed's format."""
    setup_logging("INFO", log_file=f"hb_mapper_{subcommand}.log")
    _RUNNING["subcommand"] = subcommand


def _report(lines) -> None:
    """A user error the seed's way: ERROR lines in the console and the log, then "exception in command"."""
    if "subcommand" not in _RUNNING:  # failed before logging was set up
        print_error(lines)
        return
    for line in lines:
        log.error(line)
    log.error("exception in command: %s", _RUNNING["subcommand"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hb_mapper")
def cli():
    """X5 model conversion (emulated by bpuemu)."""


def _caffe_proto(model_type: str, proto: str) -> str:
    """--proto, required with --model-type caffe and meaningless without it."""
    if model_type == "caffe" and not proto:
        raise click.UsageError("--model-type caffe needs --proto FILE.prototxt (and --model FILE.caffemodel)")
    if model_type == "onnx" and proto:
        raise click.UsageError("--proto is for --model-type caffe; an ONNX model needs only --model")
    return proto if model_type == "caffe" else ""


def _shape_pairs(values):
    from bpuemu.host.mapper.checker import parse_shape

    return {name: parse_shape(shape) for name, shape in values}


@cli.command("checker")
@click.option("--model-type", required=True, type=click.Choice(["onnx", "caffe"]))
@click.option("--march", required=True, type=click.Choice(["bayes-e"]))
@click.option("--model", "model_path", required=True, help="The float ONNX model, or the Caffe caffemodel.")
@click.option("--proto", default="", help="With --model-type caffe: the Caffe prototxt.")
@click.option("--input-shape", "input_shapes", type=(str, str), multiple=True, metavar="NAME SHAPE",
              help="Input name and shape (1x3x224x224); once per input. Overrides the model's shape.")
@click.option("--output", default="", hidden=True, help="Deprecated: the log goes to hb_mapper_checker.log.")
def checker(model_type, march, model_path, proto, input_shapes, output):
    """Check that a float model converts, and show where each node would run."""
    _logging("checker")
    from bpuemu.host.mapper.checker import check

    log.info("Start hb_mapper....")
    log.info("hb_mapper version %s", __version__)
    result = check(model_path, _shape_pairs(input_shapes), prototxt=_caffe_proto(model_type, proto))
    for w in result.warnings:
        log.warning(w)
    for line in result.placement.table().splitlines():
        log.info(line)
    for line in result.placement.cpu_reasons():
        log.info(line)
    log.info("%d subgraph(s) on BPU; %d node(s) on CPU", result.placement.subgraph_count, len(result.placement.cpu_nodes))
    log.info("End model checking....")


@cli.command("makertbin")
@click.option("-c", "--config", "config_path", default="", help="The conversion yaml.")
@click.option("--model-type", required=True, type=click.Choice(["onnx", "caffe"]))
@click.option("--fast-perf", is_flag=True, help="Build for best performance with built-in settings (no --config).")
@click.option("--model", "model_path", default="", help="With --fast-perf: the float ONNX model or Caffe caffemodel.")
@click.option("--proto", default="", help="With --fast-perf --model-type caffe: the Caffe prototxt.")
@click.option("--march", default="", help="With --fast-perf: bayes-e.")
@click.option("-i", "--input-shape", "input_shapes", type=(str, str), multiple=True, metavar="NAME SHAPE",
              help="With --fast-perf: an input's shape, once per input.")
def makertbin(config_path, model_type, fast_perf, model_path, proto, march, input_shapes):
    """Convert a float model into a .bin and the four ONNX artifacts."""
    _logging("makertbin")
    from bpuemu.host.mapper.makertbin import makertbin_fast_perf, makertbin_from_config

    log.info("Start hb_mapper....")
    log.info("hb_mapper version %s", __version__)
    if fast_perf:
        if config_path:
            raise click.UsageError("--fast-perf uses built-in settings; do not give --config")
        if march.strip().lower().startswith("nash-"):
            raise click.UsageError(f"hb_mapper converts for the X5 (bayes-e); {march} (J6) converts with "
                                   f"hb_compile --fast-perf --model FILE --march {march}")
        if not model_path or march != "bayes-e":
            raise click.UsageError("--fast-perf needs --model FILE and --march bayes-e")
        result = makertbin_fast_perf(model_path, march, _shape_pairs(input_shapes), prototxt=_caffe_proto(model_type, proto))
    else:
        if not config_path:
            raise click.UsageError("give --config FILE.yaml (or --fast-perf --model FILE)")
        result = makertbin_from_config(config_path, model_type)
    log.info("output: %s", result.bin)


@cli.command("infer")
@click.option("-c", "--config", "config_path", required=True, help="The yaml used for makertbin.")
@click.option("--model-file", required=True, help="A float or quantized ONNX model from makertbin.")
@click.option("--model-type", required=True, type=click.Choice(["onnx", "caffe"]))
@click.option("--image-file", "image_files", type=(str, str), multiple=True, required=True, metavar="NAME FILE",
              help="Input name and its data file (preprocessed binary, or an image with preprocess_on).")
@click.option("--input-layout", default="", type=click.Choice(["", "NCHW", "NHWC"]), help="Layout of the given data.")
@click.option("--output-dir", required=True, help="Where ${layername}_float.bin files go.")
def infer(config_path, model_file, model_type, image_files, input_layout, output_dir):
    """Run a float or quantized ONNX model on one input and save its outputs."""
    _logging("infer")
    from bpuemu.host.mapper.infer import run_infer

    written = run_infer(config_path, model_file, image_files, output_dir, model_type, input_layout)
    log.info("wrote %d output file(s) to %s", len(written), output_dir)


def main(args=None):
    run(cli, "hb_mapper", args, hints=HINTS, report=_report)


if __name__ == "__main__":
    main()

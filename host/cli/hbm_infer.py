"""hbm_infer MODEL.hbm --board HOST:PORT [-i name:file,...] [--frame_count N] [-o DIR]: run an .hbm on a board.

The console face of bpuemu.host.hbm_infer.HbmInfer: uploads the model once, runs the frames, prints each
output's shape and range and, with -o, saves each output as <output>.npy (what HBRuntime gives on the same
.hbm, bit for bit). Inputs are read as hb_verifier -i reads them (raw .bin, images); random ones
(hrt_model_exec's) without -i.
"""
import os

import click

from bpuemu.board.cli.options import CONNECTION_HINTS, tls_options, token_option
from bpuemu.host.cli import run, version_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option("-b", "--board", required=True, help="The board's hrt_boardd: HOST:PORT or grpc://HOST:PORT.")
@click.option("-i", "--input_file", default="", help="name1:f1,name2:f2 or f1,f2 in input order (random when empty).")
@click.option("--frame_count", default=1, show_default=True, type=click.IntRange(1), help="Frames to run (one upload).")
@click.option("-o", "--output_dir", default="", help="Save the last frame's outputs as <output>.npy here.")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Seconds each call to the board may take.")
@token_option
@tls_options
@version_option("hbm_infer")
def cli(model_file, board, input_file, frame_count, output_dir, timeout, token, tls):
    """Run an .hbm on a board over the network (upload once, infer many)."""
    from bpuemu.common.input_types import random_rt_inputs
    from bpuemu.host.hbm_infer import HbmInfer
    from bpuemu.host.verifier.inputs import load_inputs

    with HbmInfer(model_file, board, token=token, tls=tls, timeout_s=timeout) as sess:
        specs = sess.model.input_specs
        data = [x.data for x in load_inputs(input_file, specs)] if input_file else random_rt_inputs(specs)
        feed = dict(zip(sess.input_names, data))
        for _ in range(frame_count):
            outputs = sess.run(None, feed)
    click.echo(f"hbm_infer: {sess.model.name} ({sess.model.march}) on {sess.board}, {frame_count} frame(s)")
    for name, out in zip(sess.output_names, outputs):
        click.echo(f"output {name}: shape {list(out.shape)}, {out.dtype.name}, min {out.min():.6g}, max {out.max():.6g}")
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            import numpy as np

            np.save(os.path.join(output_dir, f"{name}.npy"), out)


def main(args=None):
    run(cli, "hbm_infer", args, hints=CONNECTION_HINTS)


if __name__ == "__main__":
    main()

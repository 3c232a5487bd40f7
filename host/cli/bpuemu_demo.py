"""bpuemu-demo: the main job end to end on an embedded default.

Every step runs the console script a user types (hb_mapper, hrt_boardd,
hrt_model_exec, hb_verifier) and prints its command line first, so it can be
copied.

1. writes a small float CNN, its yaml and calibration data, checks it with
   hb_mapper checker and converts it with hb_mapper makertbin (the five
   artifacts, the `.bin` among them);
2. starts a board daemon, hrt_boardd, on a free loopback port;
3. runs hrt_model_exec model_info, infer and perf against it with --board;
4. runs the same infer in-process (the x86 simulator) and checks the board's
   output is bit-identical;
5. runs hb_verifier: quanti.onnx vs the x86 simulator vs the board;
6. stops the daemon.

    bpuemu-demo [--workdir DIR] [--size 224] [--input-type nv12|rgb|bgr|yuv444]
"""
import os
import shlex
import subprocess
import tempfile

import click

from bpuemu.board.cli.edge import run
from bpuemu.host.samples.daemon import console_script, start_daemon


def _step(text: str) -> None:
    click.secho(f"\n==> {text}", bold=True)


def _run(args, cwd=None, show_stderr=False) -> str:
    """Print the command line as a user would type it, then run that console script."""
    click.echo("$ " + shlex.join(args))
    proc = subprocess.run([console_script(args[0])] + list(args[1:]), capture_output=True, text=True, cwd=cwd)
    click.echo(proc.stdout.rstrip())
    if show_stderr and proc.returncode == 0:
        click.echo(proc.stderr.rstrip())
    if proc.returncode != 0:
        click.echo(proc.stderr.rstrip(), err=True)
        raise SystemExit(proc.returncode)
    return proc.stdout


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workdir", default="", help="Where files go (default: a new temporary directory).")
@click.option("--size", default=224, show_default=True, type=click.IntRange(8, 1024), help="Input height and width (even for nv12 and yuv444).")
@click.option("--input-type", default="nv12", show_default=True,
              type=click.Choice(["nv12", "rgb", "bgr", "yuv444"]), help="input_type_rt of the model.")
@click.option("--frame-count", default=200, show_default=True, type=click.IntRange(1))
def cli(workdir, size, input_type, frame_count):
    """Convert a sample model, serve it from a local board daemon, and run it."""
    if size % 2 and input_type in ("nv12", "yuv444"):
        raise click.BadParameter(f"{size} is odd; {input_type} needs an even height and width", param_hint="--size")
    import numpy as np

    from bpuemu.host.samples import write_sample_project

    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="bpuemu-demo-"))
    os.makedirs(workdir, exist_ok=True)
    name = f"sample_{size}x{size}_{input_type}"
    mapper = ["hb_mapper"]

    _step(f"write a float CNN, its yaml and calibration data to {workdir}")
    config = write_sample_project(workdir, size=size, input_type_rt=input_type, prefix=name)
    click.echo(f"config: {config}")

    _step("hb_mapper checker: where would each node run?")
    _run(mapper + ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                   os.path.join(workdir, "sample_float.onnx")], cwd=workdir, show_stderr=True)

    _step("hb_mapper makertbin: calibrate, quantize, compile")
    _run(mapper + ["makertbin", "--config", config, "--model-type", "onnx"], cwd=workdir, show_stderr=True)
    model = os.path.join(workdir, "model_output", f"{name}.bin")
    click.echo(f"{model}: {os.path.getsize(model)} bytes")

    _step("start the board daemon hrt_boardd on loopback")
    daemon, board = start_daemon(os.path.join(workdir, "board_models"), os.path.join(workdir, "hrt_boardd.log"),
                                 echo=click.echo)
    click.echo(f"hrt_boardd pid {daemon.pid} on {board}")
    exe = ["hrt_model_exec"]
    try:
        _step("hrt_model_exec model_info on the board")
        _run(exe + ["model_info", "--model_file", model, "--board", board])

        _step("hrt_model_exec infer on the board, and in-process (x86 simulator)")
        remote_dir, local_dir = os.path.join(workdir, "dump_board"), os.path.join(workdir, "dump_sim")
        common = ["infer", "--model_file", model, "--enable_dump", "true", "--dump_format", "bin"]
        _run(exe + common + ["--board", board, "--dump_path", remote_dir])
        _run(exe + common + ["--dump_path", local_dir])
        for f in sorted(os.listdir(local_dir)):
            a = np.fromfile(os.path.join(local_dir, f), dtype=np.uint8)
            b = np.fromfile(os.path.join(remote_dir, f), dtype=np.uint8)
            same = a.size == b.size and bool(np.array_equal(a, b))
            click.echo(f"{f}: board vs simulator {'bit-identical' if same else 'DIFFERENT'}")
            if not same:
                raise SystemExit(1)

        _step("hrt_model_exec perf on the board (runs on the board; the network is not timed)")
        _run(exe + ["perf", "--model_file", model, "--board", board, "--frame_count", str(frame_count),
                    "--thread_num", "2", "--profile_path", os.path.join(workdir, "profile")])

        _step("hb_verifier: quanti.onnx vs x86 simulator vs board")
        quanti = os.path.join(workdir, "model_output", f"{name}_quantized_model.onnx")
        _run(["hb_verifier", "-m", f"{quanti},{model}", "-s", "True", "-b", f"grpc://{board}"])
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    _step(f"done: files in {workdir}")


def main(args=None):
    run(cli, "bpuemu-demo", args)


if __name__ == "__main__":
    main()

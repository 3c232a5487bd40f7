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

    bpuemu-demo [--workdir DIR] [--size 224] [--input-type nv12|rgb|bgr|yuv444] [--march nash-e]

With a J6 ``--march`` (nash-e/m/b/h/p) the same walk-through is the J6 flow's: hb_compile (the `.bc` and the
`.hbm`), an hrt_boardd started with that --march, hrt_model_exec on the `.hbm` (board and in-process
--march), hbm_infer on the board against HBRuntime on the host (bit for bit), and hb_verifier with the
quantized `.bc` vs the `.hbm` in the simulator vs the `.hbm` on the board.
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
@click.option("--march", default="bayes-e", show_default=True,
              help="bayes-e: the X5 flow (hb_mapper, .bin); nash-e/m/b/h/p: the J6 flow (hb_compile, .bc and .hbm).")
def cli(workdir, size, input_type, frame_count, march):
    """Convert a sample model, serve it from a local board daemon, and run it."""
    if size % 2 and input_type in ("nv12", "yuv444"):
        raise click.BadParameter(f"{size} is odd; {input_type} needs an even height and width", param_hint="--size")
    import numpy as np

    from bpuemu.common.march import march as march_of

    m = march_of(march)
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="bpuemu-demo-"))
    os.makedirs(workdir, exist_ok=True)
    name = f"sample_{size}x{size}_{input_type}"
    model, quanti = CONVERT[m.generation](workdir, name, size, input_type, m)
    click.echo(f"{model}: {os.path.getsize(model)} bytes")

    _step(f"start the board daemon hrt_boardd on loopback ({m.name})")
    daemon, board = start_daemon(os.path.join(workdir, "board_models"), os.path.join(workdir, "hrt_boardd.log"),
                                 echo=click.echo, extra_args=[] if m.name == "bayes-e" else ["--march", m.name])
    click.echo(f"hrt_boardd pid {daemon.pid} on {board}")
    exe = ["hrt_model_exec"]
    here = [] if m.name == "bayes-e" else ["--march", m.name]   # the in-process board's march
    try:
        _step("hrt_model_exec model_info on the board")
        _run(exe + ["model_info", "--model_file", model, "--board", board])

        _step("hrt_model_exec infer on the board, and in-process (x86 simulator)")
        remote_dir, local_dir = os.path.join(workdir, "dump_board"), os.path.join(workdir, "dump_sim")
        common = ["infer", "--model_file", model, "--enable_dump", "true", "--dump_format", "bin"]
        _run(exe + common + ["--board", board, "--dump_path", remote_dir])
        _run(exe + common + here + ["--dump_path", local_dir])
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

        if m.is_j6:
            _hbm_infer(model, board, workdir)

        _step(f"hb_verifier: {os.path.basename(quanti)} vs x86 simulator vs board")
        _run(["hb_verifier", "-m", f"{quanti},{model}", "-s", "True", "-b", f"grpc://{board}"])
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    _step(f"done: files in {workdir}")


def _convert_x5(workdir: str, name: str, size: int, input_type: str, m) -> tuple:
    """hb_mapper checker and makertbin: (the .bin, the quantized ONNX model)."""
    from bpuemu.host.samples import write_sample_project

    _step(f"write a float CNN, its yaml and calibration data to {workdir}")
    config = write_sample_project(workdir, size=size, input_type_rt=input_type, prefix=name)
    click.echo(f"config: {config}")

    _step("hb_mapper checker: where would each node run?")
    _run(["hb_mapper", "checker", "--model-type", "onnx", "--march", m.name, "--model",
          os.path.join(workdir, "sample_float.onnx")], cwd=workdir, show_stderr=True)

    _step("hb_mapper makertbin: calibrate, quantize, compile")
    _run(["hb_mapper", "makertbin", "--config", config, "--model-type", "onnx"], cwd=workdir, show_stderr=True)
    out = os.path.join(workdir, "model_output", name)
    return out + m.flow.model_suffix, out + m.flow.quantized_artifact


def _convert_j6(workdir: str, name: str, size: int, input_type: str, m) -> tuple:
    """hb_compile: (the .hbm, the quantized .bc)."""
    from bpuemu.host.samples import write_sample_project

    _step(f"write a float CNN, its hb_compile yaml ({m.name}) and calibration data to {workdir}")
    config = write_sample_project(workdir, size=size, input_type_rt=input_type, prefix=name, march=m.name)
    click.echo(f"config: {config}")

    _step("hb_compile: calibrate, quantize, compile (.bc and .hbm)")
    _run(["hb_compile", "--config", config], cwd=workdir, show_stderr=True)
    out = os.path.join(workdir, "model_output", name)
    return out + m.flow.model_suffix, out + m.flow.quantized_artifact


#: generation -> its conversion steps: (deployable model, fixed-point model) paths.
CONVERT = {"X5": _convert_x5, "J6": _convert_j6}


def _hbm_infer(model: str, board: str, workdir: str) -> None:
    """hbm_infer on the board, HBRuntime on the host: the same inputs (hrt_model_exec's random ones), the same bits."""
    import numpy as np

    from bpuemu.common.container import read_bin
    from bpuemu.common.input_types import random_rt_inputs
    from bpuemu.host.hb_runtime import HBRuntime

    _step("hbm_infer: the .hbm on the board from the host, against HBRuntime on the host")
    out_dir = os.path.join(workdir, "hbm_infer")
    _run(["hbm_infer", model, "--board", board, "-o", out_dir])
    host = HBRuntime(model)
    feed = dict(zip(host.input_names, random_rt_inputs(read_bin(model).model().input_specs)))
    for name, want in zip(host.output_names, host.run(None, feed)):
        same = bool(np.array_equal(np.load(os.path.join(out_dir, f"{name}.npy")), want))
        click.echo(f"{name}: hbm_infer (board) vs HBRuntime (host) {'bit-identical' if same else 'DIFFERENT'}")
        if not same:
            raise SystemExit(1)


def main(args=None):
    run(cli, "bpuemu-demo", args)


if __name__ == "__main__":
    main()

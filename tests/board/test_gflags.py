"""hrt_model_exec takes the seed's command lines as written: gflags spellings.

gflags accepts ``--flag value``, ``--flag=value``, one dash (``-model_file=x.bin``),
a bare boolean (``--enable_dump``) and ``true|false|True|False|1|0``. The
seed's perf line (ptq_guide_x5.txt, "hrt_model_exec perf") is copied verbatim
and run against a .bin made by hb_mapper makertbin from the sample project,
in-process and on a daemon (--board).
"""
import shlex
import subprocess
import sys

import click
from click.testing import CliRunner
import pytest

from bpuemu.board.cli.options import BOOL, GflagsCommand, gflags_args

from boardd_harness import assert_ok, assert_one_error, run_cli

#: ptq_guide_x5.txt, "The command for hrt_model_exec perf is as follows" (verbatim, continuation lines included).
SEED_PERF = r"""./hrt_model_exec perf --model_file mobilenetv1_224x224_nv12.bin \
                      --model_name="" \
                      --core_id=0 \
                      --frame_count=200 \
                      --perf_time=0 \
                      --thread_num=1 \
                      --profile_path="."
"""
#: The seed guide has no infer line; these are infer lines in each spelling gflags takes.
GFLAGS_INFER = [
    "hrt_model_exec infer --model_file=mobilenetv1_224x224_nv12.bin --enable_dump --dump_format=txt",
    "hrt_model_exec infer -model_file=mobilenetv1_224x224_nv12.bin -enable_dump=True -dump_format=bin",
    "hrt_model_exec infer --model_file mobilenetv1_224x224_nv12.bin --enable_dump true --dump_format txt",
    "hrt_model_exec infer -model_file mobilenetv1_224x224_nv12.bin --enable_dump=1 --frame_count=2",
]


def seed_args(line: str):
    """The arguments after ``hrt_model_exec`` of a shell line (backslash continuations and quotes as a shell reads them)."""
    words = shlex.split(line.replace("\\\n", " "))
    assert words[0].endswith("hrt_model_exec"), words
    return words[1:]


@pytest.fixture(scope="module")
def seed_model(tmp_path_factory):
    """A .bin made by hb_mapper makertbin from the sample project, named as in the seed."""
    from bpuemu.host.samples import write_sample_project

    work = tmp_path_factory.mktemp("seed_project")
    config = write_sample_project(str(work), size=32, input_type_rt="nv12", samples=2, prefix="mobilenetv1_224x224_nv12")
    proc = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", "--config", config,
                           "--model-type", "onnx"], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return work / "model_output" / "mobilenetv1_224x224_nv12.bin"


@pytest.fixture
def here(tmp_path, seed_model):
    """A scratch directory holding the model under the seed's file name."""
    (tmp_path / seed_model.name).symlink_to(seed_model)
    return tmp_path


# --- the rewriting, on a command of its own ------------------------------------------

@click.command(cls=GflagsCommand)
@click.option("--model_file", default="")
@click.option("--enable_dump", default=False, type=BOOL)
@click.option("--frame_count", default=1, type=int)
@click.option("-p", "--password", default="")
def probe(model_file, enable_dump, frame_count, password):
    click.echo(f"{model_file}|{enable_dump}|{frame_count}|{password}")


@pytest.mark.parametrize("args, expected", [
    (["--model_file", "a.bin"], "a.bin|False|1|"),
    (["--model_file=a.bin", "--enable_dump"], "a.bin|True|1|"),
    (["-model_file=a.bin", "-enable_dump"], "a.bin|True|1|"),
    (["-model_file", "a.bin", "--enable_dump", "--frame_count=3"], "a.bin|True|3|"),
    (["--enable_dump=False"], "|False|1|"),
    (["--enable_dump=True"], "|True|1|"),
    (["--enable_dump=0"], "|False|1|"),
    (["--enable_dump", "1"], "|True|1|"),
    (["--enable_dump", "false", "-frame_count=5"], "|False|5|"),
    (["-p", "secret"], "|False|1|secret"),  # a real short option stays one
])
def test_gflags_spellings(args, expected):
    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == expected


def test_a_bad_boolean_is_a_usage_error_naming_the_flag():
    result = CliRunner().invoke(probe, ["--enable_dump=maybe"])
    assert result.exit_code == 2
    assert "--enable_dump" in result.output and "'maybe' is not a boolean" in result.output


def test_unknown_single_dash_words_are_left_to_click():
    assert gflags_args(["-nosuchflag=1"], probe.params) == ["-nosuchflag=1"]
    result = CliRunner().invoke(probe, ["-nosuchflag=1"])
    assert result.exit_code == 2


# --- the seed's lines, for real -------------------------------------------------------

def test_seed_perf_line_in_process(here):
    result = run_cli(seed_args(SEED_PERF), here)
    assert_ok(result)
    assert "Frame count   is: 200" in result.stdout and "Thread number is: 1" in result.stdout
    assert (here / "profiler.log").exists() and (here / "profiler.csv").exists()


def test_seed_perf_line_on_a_board(here, board):
    result = run_cli(seed_args(SEED_PERF) + ["--board", board.target], here)
    assert_ok(result)
    assert "Frame      rate" in result.stdout
    assert (here / "profiler.log").read_text().count("***") == 1


@pytest.mark.parametrize("line", GFLAGS_INFER)
def test_gflags_infer_lines(here, board, line):
    args = seed_args(line)
    local = run_cli(args + ["--dump_path", "local"], here)
    remote = run_cli(args + ["--dump_path", "remote", "--board", board.target], here)
    for result in (local, remote):
        assert_ok(result)
        assert "infer success" in result.stdout
    dumped = sorted(p.name for p in (here / "local").iterdir())
    assert dumped and dumped == sorted(p.name for p in (here / "remote").iterdir())
    for name in dumped:  # board == in-process simulator, bit for bit
        assert (here / "local" / name).read_bytes() == (here / "remote" / name).read_bytes()


def test_a_misspelt_boolean_value_is_one_usage_error(here):
    result = run_cli(["infer", "-model_file=mobilenetv1_224x224_nv12.bin", "--enable_dump=yesplease"], here)
    assert result.returncode == 2 and "Traceback" not in result.output
    assert "--enable_dump" in result.stderr

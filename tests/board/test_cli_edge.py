"""One voice for every command (bpuemu.board.cli.edge): user errors, bugs, hints, warnings.

* a user error: one ``ERROR <message>`` line (and a ``Hint:`` line), exit 1, no traceback;
* a bug: one ``ERROR internal error: ...`` line, exit 70; the traceback with BPUEMU_DEBUG=1;
* a library error names no flag; the hint comes in the flags of the command that was typed;
* a library warning reaches the user through the one logging setup, in the seed's format.
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from boardd_harness import clean_env

BIN = os.path.dirname(sys.executable)
TIMESTAMPED = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "

PROBE = textwrap.dedent('''
    import logging, sys
    import click
    from bpuemu.board.cli.edge import run
    from bpuemu.common.errors import InvalidInput

    @click.command()
    @click.argument("what")
    def cli(what):
        logging.getLogger("bpuemu.some.library").warning("a warning from a library")
        if what == "user":
            raise InvalidInput("the input is wrong", subject="input_file")
        if what == "bug":
            {}["missing"]
        if what == "oserror":
            open("/proc/no-such-dir/out.bin", "wb")
        if what == "oserror-no-path":
            raise OSError("a socket went away")

    run(cli, "probe", hints={"input_file": "pass --probe_input FILE"})
''')


def probe(what: str, **env):
    return subprocess.run([sys.executable, "-c", PROBE, what], capture_output=True, text=True, timeout=60,
                          env=clean_env(**env))


def test_a_user_error_is_one_line_and_the_commands_own_hint():
    p = probe("user")
    assert p.returncode == 1
    lines = p.stderr.splitlines()
    assert re.match(TIMESTAMPED + "WARNING a warning from a library$", lines[0]), p.stderr
    assert lines[1:] == ["ERROR the input is wrong", "Hint: pass --probe_input FILE"]


def test_a_bug_has_its_own_exit_code_and_its_traceback_only_on_request():
    p = probe("bug")
    assert p.returncode == 70
    assert p.stderr.splitlines()[-1] == "ERROR internal error: KeyError: 'missing' (set BPUEMU_DEBUG=1 for the traceback)"
    assert "Traceback" not in p.stderr
    debug = probe("bug", BPUEMU_DEBUG="1")
    assert debug.returncode == 70 and "Traceback (most recent call last)" in debug.stderr


def test_a_file_the_system_refuses_is_a_user_error_naming_it():
    p = probe("oserror")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[-1] == "ERROR cannot use /proc/no-such-dir/out.bin: No such file or directory"
    assert probe("oserror-no-path").returncode == 70   # an OSError naming no file is still a bug


def test_a_bad_command_line_is_a_usage_error():
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 2 and "Missing argument 'WHAT'" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("command", [
    ["hrt_model_exec", "infer", "--model_file", "nope.bin"],
    ["hrt_model_exec", "perf", "-model_file=nope.bin", "--thread_num=2"],
    ["hb_verifier", "-m", "nope.onnx,nope.bin", "-s", "True"],
    ["hb_model_info", "nope.bin"],
    ["hb_perf", "nope.bin"],
    ["hb_model_modifier", "nope.bin"],
    ["hb_pack", "nope.bin", "nope.bin", "-o", "out.bin"],
    ["hb_mapper", "checker", "--model-type", "onnx", "--march", "bayes-e", "--model", "nope.onnx"],
    ["hb_mapper", "makertbin", "--config", "nope.yaml", "--model-type", "onnx"],
])
def test_every_command_reports_a_missing_file_the_same_way(tmp_path, command):
    p = subprocess.run([os.path.join(BIN, command[0]), *command[1:]], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=clean_env())
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout.strip() == ""
    lines = p.stderr.splitlines()
    # The seed's hb_mapper and hb_pack also say "ERROR exception in command: <subcommand>".
    errors = [line for line in lines if re.search(r"(^|\d )ERROR ", line) and "exception in command: " not in line]
    assert errors and "nope." in errors[0], p.stderr
    if command[0] == "hb_mapper":  # the seed's way: in its log format, and in hb_mapper_<subcommand>.log
        assert re.match(TIMESTAMPED + "ERROR ", errors[0]) and lines[-1].endswith(f"ERROR exception in command: {command[1]}")
        assert "nope." in (tmp_path / f"hb_mapper_{command[1]}.log").read_text()
    else:
        assert len(errors) == 1 and errors[0].startswith("ERROR "), p.stderr
        assert all(line.startswith(("ERROR ", "Hint: ")) for line in lines), p.stderr


def test_the_hint_speaks_the_typed_commands_flags(rgb_model, tmp_path):
    """A library error about the input files: hrt_model_exec hints its own --input_file."""
    two = f"{rgb_model.path},{rgb_model.path}"
    p = subprocess.run([os.path.join(BIN, "hrt_model_exec"), "infer", "--model_file", rgb_model.path, "--input_file",
                        two], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env())
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == ["ERROR the model has 1 input(s) (data) but 2 input file(s) were given",
                                     "Hint: pass one file per input: --input_file a.bin,b.bin"], p.stderr


@pytest.mark.parametrize("command", [["hrt_model_exec", "model_info", "--model_file", "{model}", "--board", "127.0.0.1:1"],
                                     ["hb_verifier", "-m", "{model}", "-s", "True", "-b", "grpc://127.0.0.1:1"]])
def test_the_library_hint_and_the_commands_flag_together(rgb_model, tmp_path, command):
    """A plain connection to a board that is not there: the library's advice plus the typed command's flag."""
    args = [a.replace("{model}", rgb_model.path) for a in command]
    p = subprocess.run([os.path.join(BIN, args[0]), *args[1:]], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=clean_env())
    assert p.returncode == 1
    assert p.stderr.splitlines()[-1] == ("Hint: is hrt_boardd running there? start it with: hrt_boardd --listen "
                                         "127.0.0.1:1; if it serves TLS, give its CA (--tls-ca FILE)"), p.stderr

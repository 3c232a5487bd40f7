"""hb_verifier: compare quanti.onnx, the x86 simulator and boards on the same inputs.

    hb_verifier -m quanti.onnx,model.bin -b 192.168.1.10 -u root -p PASSWORD -s True   # SSH, as in the seed
    hb_verifier -m quanti.onnx,model.bin -b grpc://192.168.1.10:9473 -s True          # hrt_boardd (gRPC)
    hb_verifier -m quanti.onnx,model.bin -s True [-i img.jpg] [-c 5] [-r True]         # host only

How ``-b`` reaches a board (one rule, from the target's form):

* ``HOST[:PORT]`` or ``ssh://[USER@]HOST[:PORT]``: over SSH (port 22), as the
  seed does: the board's own hrt_model_exec runs there; ``-u`` (default root),
  ``-p``, ``--identity``, ``--known-hosts``, ``--accept-new-host-key``,
  ``--remote-command`` apply;
* ``grpc://HOST[:PORT]``: the board's hrt_boardd (port 9473); ``--token-file``
  and ``--tls-ca/--tls-cert/--tls-key/--tls-server-name`` apply, the same
  option groups as hrt_model_exec's (bpuemu.board.cli.options).

``-b`` repeats or takes a list (``a,b``, ``@boards.txt``). A flag that applies
to no board given is a usage error naming it. Flags are the seed's (ptq_guide,
"hb_verifier Tool"); the logic lives in bpuemu.host.verifier. Exit status: 0
when every comparison passes, 1 when one fails or on an error (one ERROR
line), 2 on a bad command line.
"""
import functools
import sys
from typing import List, Tuple

import click

from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import (BOOL, CONNECTION_HINTS, GRPC_PARAMS, SSH_PARAMS, board_option, refuse, ssh_login_options,
                                      tls_options, token_option, typed_flags, version_option)

SSH_SCHEME, GRPC_SCHEME = "ssh://", "grpc://"

#: Hints in hb_verifier's own flags for library errors about a subject (bpuemu.board.cli.edge).
HINTS = {**CONNECTION_HINTS, "model_name": "pass --model-name NAME",
         "input_file": "pass one file per input: -i name1:f1,name2:f2 or -i f1,f2",
         "ssh_login": "check the user (-u), the password (-p) or the key (--identity)",
         "sides": "run two of quanti.onnx (-m quanti.onnx,model.bin), the simulator (-s True) and a board (-b BOARD_IP); "
                  "e.g. hb_verifier -m quanti.onnx,model.bin -s True -b BOARD"}


def _models(value: str):
    files = [v.strip() for v in value.split(",") if v.strip()]
    onnx_files = [f for f in files if f.lower().endswith((".onnx", ".bc"))]   # J6: the quantized .bc
    bins = [f for f in files if f.lower().endswith((".bin", ".hbm"))]
    other = [f for f in files if f not in onnx_files and f not in bins]
    if other or len(bins) != 1 or len(onnx_files) > 1:
        raise click.BadParameter(f"'{value}': give the fixed-point model and the bin model as quanti.onnx,model.bin "
                                 f"(J6: model_quantized_model.bc,model.hbm; or the .bin/.hbm alone to compare "
                                 f"simulator and board)", param_hint="-m")
    return (onnx_files[0] if onnx_files else ""), bins[0]


def split_boards(values) -> Tuple[List[str], List[str]]:
    """(SSH targets, gRPC targets) of the -b values, by the rule in the module docstring."""
    from bpuemu.board.farm import board_entries, parse_boards

    ssh, grpc = [], []
    for value in values:
        for entry in board_entries(value):
            if entry.startswith(GRPC_SCHEME):
                grpc += parse_boards(entry)
            elif "://" in entry and not entry.startswith(SSH_SCHEME):
                raise click.BadParameter(f"'{entry}': a board is HOST[:PORT] or ssh://HOST[:PORT] (SSH), "
                                         f"or grpc://HOST[:PORT] (hrt_boardd)", param_hint="-b")
            else:
                ssh.append(entry[len(SSH_SCHEME):] if entry.startswith(SSH_SCHEME) else entry)
    return ssh, grpc


def _boards_by_transport(f):
    """Split -b into SSH and gRPC boards and refuse the flags that apply to neither kind given.

    The outermost wrapper: it runs before the option groups read any file
    (a --token-file that cannot apply is refused, not read).
    """

    @functools.wraps(f)
    def wrapper(*args, board, **kwargs):
        ssh_boards, grpc_boards = split_boards(board)
        if not ssh_boards:
            refuse(typed_flags(*SSH_PARAMS), "applies to boards reached over SSH (-b HOST[:PORT]); none is given")
        if not grpc_boards:
            refuse(typed_flags(*GRPC_PARAMS), "applies to boards running hrt_boardd (-b grpc://HOST[:PORT]); "
                                              "none is given")
        return f(*args, ssh_boards=ssh_boards, grpc_boards=grpc_boards, **kwargs)

    return wrapper


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@_boards_by_transport
@version_option("hb_verifier")
@click.option("-m", "--model", "model", required=True, metavar="QUANTI.onnx,MODEL.bin",
              help="The fixed-point (quantized) ONNX model and the bin model, comma separated.")
@board_option("-b", "--board-ip", multiple=True, metavar="[ssh://|grpc://]HOST[:PORT][,...]|@FILE",
              help="Board to run the bin model on: HOST[:PORT] is reached over SSH (port 22), as in the seed; "
                   f"grpc://HOST[:PORT] is its hrt_boardd (port {DEFAULT_PORT}). Repeat, comma-separate or give @FILE "
                   "for several boards.")
@click.option("-s", "--run-sim", "run_sim", default=False, type=BOOL, show_default=True,
              help="Also run the bin model in the x86 simulator (the board runtime in this process).")
@click.option("-i", "--input-img", "input_img", default="", metavar="FILES",
              help="Input data: images (.jpg/.png) or raw input_type_rt data (.bin); several inputs as "
                   "name1:f1,name2:f2 or f1,f2. Default: random data.")
@click.option("-c", "--compare_digits", "--compare-digits", "digits", default=5, show_default=True, type=click.IntRange(0, 15),
              help="Decimal places compared: values differ when they differ after rounding to this many places.")
@click.option("-r", "--dump-all-nodes-results", "dump_all", default=False, type=BOOL, show_default=True,
              help="Dump every node's output on every side, compare those with the same name and name the first "
                   "node where two sides diverge.")
@click.option("-u", "--username", default=None, help="Board user (SSH) [default: root, or USER of -b USER@HOST].")
@ssh_login_options
@token_option
@tls_options
@click.option("--lsb", type=click.FloatRange(0), default=None,
              help="Also accept values within N quantization steps (LSBs) of each output's scale.")
@click.option("--model-name", "model_name", default="", help="Model to verify when the bin file holds several.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--json", "json_path", default="", metavar="FILE", help="Also write the full report as JSON.")
@click.option("--save-repro", "repro_dir", default="", metavar="DIR",
              help="Write one archive into DIR that reproduces this comparison elsewhere (the models, inputs, each "
                   "side's outputs, versions, hashes): bpuemu-repro run ARCHIVE [-b BOARD].")
def cli(model, ssh_boards, grpc_boards, run_sim, input_img, digits, dump_all, username, ssh_settings, token, tls, lsb,
        model_name, seed, json_path, repro_dir):
    """Verify that quanti.onnx, the x86 simulator and the board compute the same results.

    Exits 0 only when every comparison passes; 1 when one fails or on an error.
    """
    quanti, bin_model = _models(model)

    from bpuemu.host.clients.ssh_options import SshOptions
    from bpuemu.host.verifier.core import VerifyOptions, verify

    ssh = SshOptions(target="", user=username or None, **ssh_settings)
    options = VerifyOptions(bin_model=bin_model, quanti_model=quanti, model_name=model_name, run_sim=run_sim,
                            boards=[SSH_SCHEME + b for b in ssh_boards] + [GRPC_SCHEME + b for b in grpc_boards],
                            ssh=ssh, token=token, tls=tls, input_files=input_img, seed=seed, digits=digits,
                            dump_all=dump_all, lsb=lsb)
    from tqdm import tqdm

    bar = functools.partial(tqdm, desc="Compare progress", file=sys.stderr, ascii=True, leave=True)  # the seed's bar
    report = verify(options, echo=click.echo, progress=lambda total: bar(total=total))
    if json_path:
        report.write_json(json_path)
    if repro_dir:
        from bpuemu.host.verifier.repro import write_bundle

        click.echo(f"INFO repro bundle: {write_bundle(repro_dir, options, report)} (re-run it with: bpuemu-repro run "
                   f"ARCHIVE [-b BOARD])")
    failed = [p.source for p in report.pairs if not p.passed]
    if failed:
        click.echo(f"WARNING hb_verifier: {len(failed)} of {len(report.pairs)} comparison(s) FAILED: {', '.join(failed)}")
        if not repro_dir:
            click.echo("Hint: add --save-repro DIR to write one archive that reproduces this comparison on another "
                       "machine (bpuemu-repro run ARCHIVE [-b BOARD])")
        sys.exit(1)
    click.echo(f"INFO hb_verifier: all {len(report.pairs)} comparison(s) PASSED")


def main(args=None):
    run(cli, "hb_verifier", args, hints=HINTS)


if __name__ == "__main__":
    main()

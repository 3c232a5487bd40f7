"""hb_verifier: compare quanti.onnx, the x86 simulator and boards on the same inputs.

    hb_verifier -m quanti.onnx,model.bin -b 192.168.1.10 -s True [-i img.jpg] [-c 5] [-r True]
    hb_verifier -m quanti.onnx,model.bin -s True
    hb_verifier -m quanti.onnx,model.bin -b board --ssh -u root --identity ~/.ssh/id_ed25519

Flags are the seed's (ptq_guide, "hb_verifier Tool"); the logic lives in
bpuemu.host.verifier. Exit status: 0 when every comparison passes, 1 when one
fails or on an error (one ERROR line), 2 on a bad command line.
"""
import sys

import click

from bpuemu.common.errors import InvalidInput
from bpuemu.common.version import __version__
from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import BOOL


def _models(value: str):
    files = [v.strip() for v in value.split(",") if v.strip()]
    onnx_files = [f for f in files if f.lower().endswith(".onnx")]
    bins = [f for f in files if f.lower().endswith(".bin")]
    other = [f for f in files if f not in onnx_files and f not in bins]
    if other or len(bins) != 1 or len(onnx_files) > 1:
        raise click.BadParameter(f"'{value}': give the fixed-point model and the bin model as quanti.onnx,model.bin "
                                 f"(or model.bin alone to compare simulator and board)", param_hint="-m")
    return (onnx_files[0] if onnx_files else ""), bins[0]


def _boards(values):
    return [b.strip() for v in values for b in v.split(",") if b.strip()]


def _token(token_file: str):
    import os

    if token_file:
        try:
            with open(token_file) as f:
                return f.read().strip() or None
        except OSError as exc:
            raise InvalidInput(f"cannot read token file {token_file}: {exc.strerror}") from None
    return os.environ.get("BPUEMU_TOKEN") or None


class _Bar:
    """tqdm on stderr, as the seed's "Compare progress" bar."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="Compare progress", file=sys.stderr, ascii=True, leave=True)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="hb_verifier")
@click.option("-m", "--model", "model", required=True, metavar="QUANTI.onnx,MODEL.bin",
              help="The fixed-point (quantized) ONNX model and the bin model, comma separated.")
@click.option("-b", "--board-ip", "board_ip", multiple=True, metavar="HOST[:PORT]",
              help=f"Board to run the bin model on: hrt_boardd's gRPC port (default {DEFAULT_PORT}), or with --ssh "
                   f"the SSH port (default 22). Repeat or comma-separate to verify on several boards.")
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
@click.option("-p", "--password", default="", envvar="BPUEMU_SSH_PASSWORD",
              help="Board password (SSH; or set BPUEMU_SSH_PASSWORD). Omit when the board has none or uses keys.")
@click.option("--ssh", "use_ssh", is_flag=True, help="Reach the boards over SSH and run hrt_model_exec there (default: gRPC).")
@click.option("--identity", default="", metavar="FILE", help="SSH private key file.")
@click.option("--known-hosts", "known_hosts", default="", metavar="FILE",
              help="known_hosts file checked for board host keys [default: ~/.ssh/known_hosts].")
@click.option("--accept-new-host-key", "accept_new", is_flag=True,
              help="Trust and record a board host key that known_hosts lacks (a changed key is always refused).")
@click.option("--remote-command", "remote_command", default="hrt_model_exec", show_default=True,
              help="How to run hrt_model_exec on an SSH board.")
@click.option("--token-file", "token_file", default="", help="Token for a gRPC board that requires one (or set BPUEMU_TOKEN).")
@click.option("--lsb", type=click.FloatRange(0), default=None,
              help="Also accept values within N quantization steps (LSBs) of each output's scale.")
@click.option("--model-name", "model_name", default="", help="Model to verify when the bin file holds several.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--json", "json_path", default="", metavar="FILE", help="Also write the full report as JSON.")
def cli(model, board_ip, run_sim, input_img, digits, dump_all, username, password, use_ssh, identity, known_hosts,
        accept_new, remote_command, token_file, lsb, model_name, seed, json_path):
    """Verify that quanti.onnx, the x86 simulator and the board compute the same results.

    Exits 0 only when every comparison passes; 1 when one fails or on an error.
    """
    quanti, bin_model = _models(model)
    boards = _boards(board_ip)
    if use_ssh and not boards:
        raise click.UsageError("--ssh needs a board: -b HOST[:PORT]")
    if not use_ssh and (identity or known_hosts or accept_new):
        raise click.UsageError("--identity, --known-hosts and --accept-new-host-key apply with --ssh")

    from bpuemu.host.verifier.core import VerifyOptions, verify

    ssh = None
    if use_ssh:
        from bpuemu.host.clients.ssh_options import SshOptions

        ssh = SshOptions(target="", user=username or None, password=password or None, identity=identity or None,
                         known_hosts=known_hosts or None, accept_new_host_key=accept_new, remote_command=remote_command)
    options = VerifyOptions(bin_model=bin_model, quanti_model=quanti, model_name=model_name, run_sim=run_sim,
                            boards=boards, ssh=ssh, token=None if use_ssh else _token(token_file), input_files=input_img,
                            seed=seed, digits=digits, dump_all=dump_all, lsb=lsb)
    report = verify(options, echo=click.echo, progress=_Bar)
    if json_path:
        report.write_json(json_path)
    failed = [p.source for p in report.pairs if not p.passed]
    if failed:
        click.echo(f"WARNING hb_verifier: {len(failed)} of {len(report.pairs)} comparison(s) FAILED: {', '.join(failed)}")
        sys.exit(1)
    click.echo(f"INFO hb_verifier: all {len(report.pairs)} comparison(s) PASSED")


def main(args=None):
    run(cli, "hb_verifier", args)


if __name__ == "__main__":
    main()

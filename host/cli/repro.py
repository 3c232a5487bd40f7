"""bpuemu-repro: run a repro bundle that ``hb_verifier --save-repro DIR`` wrote, here and on a board.

    bpuemu-repro run model_repro_20260101T000000Z.tar.gz                 # quanti.onnx and the simulator, here
    bpuemu-repro run model_repro_20260101T000000Z.tar.gz -b grpc://HOST  # and on that board

Says for each side whether it reproduced the bundle's outputs bit for bit; exits 0 only when every side did.
"""
import click

from bpuemu.board.cli.edge import run as run_edge
from bpuemu.board.cli.options import CONNECTION_HINTS, tls_options, token_option, version_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("bpuemu-repro")
def cli():
    """Run repro bundles written by hb_verifier --save-repro."""


@cli.command("run")
@click.argument("archive", metavar="ARCHIVE")
@click.option("-b", "--board-ip", "board", default="", metavar="[ssh://|grpc://]HOST[:PORT]",
              help="Also run it on this board, in the form hb_verifier -b takes: HOST[:PORT] over SSH, "
                   "grpc://HOST[:PORT] on its hrt_boardd.")
@token_option
@tls_options
def run_bundle(archive, board, token, tls):
    """Re-run the comparison in ARCHIVE on this host (quanti.onnx, the simulator) and, with -b, on a board."""
    from bpuemu.host.clients.ssh_options import SshOptions
    from bpuemu.host.cli.hb_verifier import GRPC_SCHEME, SSH_SCHEME, split_boards
    from bpuemu.host.verifier.repro import read_bundle, rerun

    target = ""
    if board:
        ssh_boards, grpc_boards = split_boards([board])
        if len(ssh_boards) + len(grpc_boards) != 1:
            raise click.BadParameter(f"'{board}': give one board", param_hint="-b")
        target = SSH_SCHEME + ssh_boards[0] if ssh_boards else GRPC_SCHEME + grpc_boards[0]
    bundle = read_bundle(archive)
    m = bundle.manifest
    click.echo(f"bundle: {m['model_name']} ({m.get('march') or 'march not recorded'}), written by bpuemu {m['bpuemu']} "
               f"on {m['created']}; sides: " + ", ".join(f"{s['label']} [{s['platform']}]" for s in m["sides"]))
    outcomes = rerun(bundle, target, token=token, tls=tls, ssh=SshOptions(target="") if target.startswith(SSH_SCHEME) else None)
    for outcome in outcomes:
        click.echo(outcome.line())
    if not all(o.reproduced for o in outcomes):
        raise SystemExit(1)


def main(args=None):
    run_edge(cli, "bpuemu-repro", args, hints=CONNECTION_HINTS)


if __name__ == "__main__":
    main()

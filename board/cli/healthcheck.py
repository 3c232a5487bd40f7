"""The health probe's command line (deploy/ runs it as python -m bpuemu.board.daemon.healthcheck).

    python -m bpuemu.board.daemon.healthcheck [--target 127.0.0.1:9473] [--service NAME] [--timeout 3] [-q]

Exit 0 when the board is SERVING, 1 otherwise (one ERROR line); the probe
itself is bpuemu.board.health.check.
"""
import click

from bpuemu.common.errors import BoardUnavailable
from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import CONNECTION_HINTS, tls_options, version_option
from bpuemu.board.health import check


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hrt_boardd-healthcheck")
@click.option("--target", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True, metavar="HOST:PORT",
              help="The board daemon's gRPC address.")
@click.option("--service", default="", help="Service to ask about (\"\": the whole server).")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Seconds to wait.")
@tls_options
@click.option("-q", "--quiet", is_flag=True, help="Print nothing when the board is SERVING.")
def cli(target, service, timeout, tls, quiet):
    """Exit 0 when the hrt_boardd at TARGET reports SERVING, 1 otherwise."""
    status = check(target, service, timeout, tls)
    if status != "SERVING":
        raise BoardUnavailable(f"hrt_boardd at {target} reports {status}" + (f" for service '{service}'" if service else ""))
    if not quiet:
        click.echo(f"{target}: SERVING")


def main(args=None):
    run(cli, "hrt_boardd-healthcheck", args, hints={**CONNECTION_HINTS, "deadline": "raise --timeout"})


if __name__ == "__main__":
    main()

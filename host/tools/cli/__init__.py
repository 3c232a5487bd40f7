"""The click commands of the model tools: thin edges over bpuemu.host.tools.

One module per command; what they share (logging in the seed's format, the
``-m`` model option, the run-and-translate-errors edge) is here.
"""
import logging
import sys

import click

from bpuemu.board.cliutil import main_entry
from bpuemu.common.version import __version__

#: The seed's log lines: "2022-04-21 18:22:30,207 INFO Nodes that can be deleted: [...]"
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"

log = logging.getLogger("bpuemu.host.tools")


def setup_logging() -> None:
    """Console logging for one tool run (entry points only; never at import)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def version_option(prog: str):
    return click.version_option(__version__, "--version", prog_name=prog)


def model_name_option(f):
    return click.option("-m", "model_name", default="", metavar="NAME",
                        help="Model name: with a packed BIN_FILE, only this model.")(f)


def run(command: click.Command, prog: str, args=None) -> None:
    main_entry(command, prog, args)

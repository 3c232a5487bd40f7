"""The host's commands, one module per command, on the shared edge (bpuemu.board.cli).

    hb_mapper (checker | makertbin | infer), hb_verifier, hb_model_info, hb_pack,
    hb_model_modifier, hb_perf, bpuemu-demo

Each module is a thin click edge over a library package (bpuemu.host.mapper,
.verifier, .tools, .samples) and runs with ``python -m bpuemu.host.cli.NAME``.
The error edge, the logging setup and the option groups they share are
``bpuemu.board.cli`` (the board's commands use the same ones); what only the
model tools share is here.
"""
import logging

import click

from bpuemu.board.cli.edge import run
from bpuemu.board.cli.logs import setup_logging
from bpuemu.board.cli.options import version_option

#: The model tools log as "2022-04-21 18:22:30,207 INFO Nodes that can be deleted: [...]" (the seed's lines).
log = logging.getLogger("bpuemu.host.tools")

__all__ = ["log", "model_name_option", "run", "setup_logging", "version_option"]


def model_name_option(f):
    return click.option("-m", "model_name", default="", metavar="NAME",
                        help="Model name: with a packed BIN_FILE, only this model.")(f)

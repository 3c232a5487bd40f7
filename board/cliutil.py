"""The CLI edge shared by board and host commands.

``main_entry`` runs a click command so that a BpuEmuError (or a click usage
error) ends in one clear line on stderr and a non-zero exit, never a
traceback. Set BPUEMU_DEBUG=1 to see the traceback of an unexpected error.

Client commands also silence gRPC's own C-core log (GRPC_VERBOSITY=NONE unless
set): it would print handshake and connection noise next to the one line the
client's error translator writes. The daemon keeps it (``grpc_core_log``).
"""
import logging
import os
import sys
import traceback

import click

from bpuemu.common.errors import BpuEmuError


def setup_logging(level: str = "INFO", log_file: str = "") -> None:
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main_entry(command: click.Command, prog_name: str, args=None, grpc_core_log: bool = False) -> None:
    if not grpc_core_log and not os.environ.get("BPUEMU_DEBUG"):
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # read when grpc is first imported
    try:
        command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # usage errors: exit 2 with click's message
        exc.show()
        sys.exit(exc.exit_code)
    except BpuEmuError as exc:
        for i, line in enumerate(str(exc).splitlines()):
            click.echo(("ERROR " if i == 0 else "") + line, err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: still one line unless asked for more
        if os.environ.get("BPUEMU_DEBUG"):
            traceback.print_exc()
        click.echo(f"ERROR internal error: {type(exc).__name__}: {exc} (set BPUEMU_DEBUG=1 for the traceback)", err=True)
        sys.exit(70)
    sys.exit(0)


class BoolFlag(click.ParamType):
    """gflags-style booleans: --enable_dump, --enable_dump=true, --enable_dump false."""

    name = "bool"

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            return value
        v = str(value).strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off", ""):
            return False
        self.fail(f"'{value}' is not a boolean (use true or false)", param, ctx)

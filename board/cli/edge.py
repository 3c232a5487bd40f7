"""The edge of every bpuemu command: how its outcome reaches the user.

``run(command, prog)`` runs a click command so that

* a user error (``BpuEmuError``) is one ``ERROR <message>`` line on stderr
  (and its ``Hint:`` line), exit status ``exc.exit_code`` (1), no traceback;
* a bad command line (click's ``UsageError``) is click's message, exit 2;
* a file the system refuses (an ``OSError`` naming a path: a missing or
  unwritable output folder, a full disk) is one ``ERROR cannot use PATH: why``
  line, exit 1: the user's file system, not a bug;
* a bug (any other exception) is one ``ERROR internal error: ...`` line,
  exit 70 (EX_SOFTWARE); ``BPUEMU_DEBUG=1`` prints the traceback;
* Ctrl-C is "Interrupted.", exit 130.

Before the command runs, the edge sets up the one logging setup
(bpuemu.board.cli.logs) at WARNING, so a library's warning (an unknown SSH
host key recorded, a yaml key bpuemu does not act on) reaches the user in the
seed's format; a command that logs more (hb_mapper's INFO lines and log file,
hrt_boardd) sets it up again in its callback.

Library errors name no command-line flag, because the same library serves
several commands that spell their flags differently. An error may carry a
``subject`` (for example ``"model_name"``); each command passes ``hints``
mapping subjects to advice in its own flags, and the edge prints that as the
``Hint:`` (``{hint}`` in it stands for the library's own hint).

Client commands also silence gRPC's own C-core log (GRPC_VERBOSITY=NONE unless
set): it would print handshake and connection noise next to the one line the
client's error translator writes. The daemon keeps it (``grpc_core_log``).
"""
import os
import sys
import traceback
from typing import Callable, Mapping, Optional, Sequence

import click

from bpuemu.common.errors import BpuEmuError
from bpuemu.board.cli.logs import setup_logging

#: Exit status of a bug (BSD sysexits EX_SOFTWARE), distinct from a user error's 1.
EXIT_BUG = 70
EXIT_INTERRUPTED = 130


def debug_enabled() -> bool:
    return os.environ.get("BPUEMU_DEBUG", "") not in ("", "0")


def error_lines(exc: BpuEmuError, hints: Optional[Mapping[str, str]] = None) -> list:
    """The lines a user error prints: the message, then a hint (in this command's own flags when it has one)."""
    lines = str(exc.message).splitlines() or [type(exc).__name__]
    hint = (hints or {}).get(getattr(exc, "subject", "") or "", "").replace("{hint}", exc.hint) or exc.hint
    if hint:
        lines.append(f"Hint: {hint}")
    return lines


def print_error(lines: Sequence[str]) -> None:
    """``ERROR <first line>``, then the other lines (a ``Hint:``) as they are, on stderr."""
    for i, line in enumerate(lines):
        click.echo(("ERROR " if i == 0 else "") + line, err=True)


def run(command: click.Command, prog: str, args=None, *, grpc_core_log: bool = False,
        hints: Optional[Mapping[str, str]] = None,
        report: Optional[Callable[[Sequence[str]], None]] = None) -> None:
    """Run ``command`` as the program ``prog`` and exit with its status (never returns).

    ``report(lines)`` replaces how a user error is shown (hb_mapper also logs it
    to its log file, the seed's way); by default ``ERROR <line>`` on stderr.
    """
    if not grpc_core_log and not debug_enabled():
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # read when grpc is first imported
    setup_logging("DEBUG" if debug_enabled() else "WARNING")
    try:
        command.main(args=args, prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:  # usage errors: exit 2 with click's message
        exc.show()
        sys.exit(exc.exit_code)
    except BpuEmuError as exc:
        (report or print_error)(error_lines(exc, hints))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as exc:
        if exc.filename is None:
            _bug(exc)
        if debug_enabled():
            traceback.print_exc()
        (report or print_error)([f"cannot use {exc.filename}: {exc.strerror or exc}"])
        sys.exit(1)
    except Exception as exc:  # a bug: still one line unless asked for more
        _bug(exc)
    sys.exit(0)


def _bug(exc: BaseException) -> None:
    """A bug: one line (the traceback with BPUEMU_DEBUG=1), exit 70."""
    if debug_enabled():
        traceback.print_exc()
    click.echo(f"ERROR internal error: {type(exc).__name__}: {exc} (set BPUEMU_DEBUG=1 for the traceback)", err=True)
    sys.exit(EXIT_BUG)



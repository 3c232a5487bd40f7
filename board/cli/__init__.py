"""The one CLI package of bpuemu: the edge every command runs through.

It lives in the board because the board's own commands use it and the board
never imports the host; host commands (``bpuemu.host.cli``) use it too.

* ``edge``       -- ``run(command, prog)``: how user errors, usage errors and
                    bugs reach the user (one line, exit codes, BPUEMU_DEBUG=1);
* ``logs``       -- ``setup_logging``: the one logging setup (seed format,
                    optional log file, Python warnings routed through it);
* ``options``    -- reusable option groups (model, connection: --board lists,
                    --token-file, TLS, SSH) and the gflags-style boolean type;
* one module per board command: ``hrt_model_exec`` (+ ``hrt_model_exec_text``),
  ``hrt_boardd``, ``healthcheck``.

Only the CLI packages (this one and ``bpuemu.host.cli``) import click
(tests/test_architecture.py). Each command module runs with ``python -m``.
"""
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.logs import setup_logging

__all__ = ["run", "setup_logging"]

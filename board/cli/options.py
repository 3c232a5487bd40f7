"""Option groups every bpuemu command shares, defined once.

* ``model_options``      -- --model_file, --model_name, --core_id (hrt_model_exec);
* ``connection_options`` -- how to reach the board(s): --board (``a:p,b:p`` or
  ``@boards.txt``), --token-file, the TLS group and the SSH group;
* ``tls_options``        -- --tls-ca/--tls-cert/--tls-key/--tls-server-name,
  gathered into one ``tls`` argument (a TlsConfig, or None);
* ``token_option``       -- --token-file, gathered into ``token`` (else $BPUEMU_TOKEN);
* ``ssh_login_options``  -- -p/--password, --identity, --known-hosts,
  --accept-new-host-key, --remote-command, --remote-tmp, gathered into ``ssh_settings``;
* ``typed_flags``/``refuse`` -- a flag the user typed that cannot apply is a
  usage error naming it;
* ``BOOL`` and ``GflagsCommand`` -- the seed's gflags-style command lines:
  ``--enable_dump``, ``--enable_dump=True``, ``-model_file=m.bin``.

A group gathers its flags into one typed argument, so a command's callback
receives ``tls=TlsConfig(...)`` rather than four strings, and refuses a flag
that cannot apply (naming it) instead of dropping it.
"""
import functools
from typing import List

import click

from bpuemu.common.version import __version__


# --- gflags-style values and spellings ------------------------------------------------

class BoolFlag(click.ParamType):
    """gflags-style booleans: --enable_dump, --enable_dump=true|false|True|False|1|0, --enable_dump false."""

    name = "bool"
    TRUE = ("1", "true", "yes", "on")
    FALSE = ("0", "false", "no", "off")

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            return value
        v = str(value).strip().lower()
        if v in self.TRUE:
            return True
        if v in self.FALSE or v == "":
            return False
        self.fail(f"'{value}' is not a boolean (use true or false)", param, ctx)


BOOL = BoolFlag()


def gflags_args(args: List[str], params) -> List[str]:
    """Rewrite gflags spellings into click's: ``-name=v`` -> ``--name=v``; a bare boolean -> ``--name=true``.

    gflags takes any long flag with one dash or two, and a boolean flag with no
    value; click wants two dashes and a value for a typed option.
    """
    longs, booleans = set(), set()
    for p in params:
        for opt in getattr(p, "opts", []) + getattr(p, "secondary_opts", []):
            if opt.startswith("--"):
                longs.add(opt)
                if isinstance(p.type, BoolFlag):
                    booleans.add(opt)
    out = []
    for i, arg in enumerate(args):
        if arg == "--":
            out += args[i:]
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg.split("=", 1)[0]) > 2:
            if "-" + arg.split("=", 1)[0] in longs:
                arg = "-" + arg
        name = arg.split("=", 1)[0]
        if name in booleans and "=" not in arg:
            following = args[i + 1] if i + 1 < len(args) else None
            if following is None or following.startswith("-") or following.lower() not in BoolFlag.TRUE + BoolFlag.FALSE:
                arg += "=true"
        out.append(arg)
    return out


class GflagsCommand(click.Command):
    """A click command that also takes the gflags spellings of its flags (see ``gflags_args``)."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, gflags_args(list(args), self.get_params(ctx)))


def version_option(prog: str, *decls: str, version: str = __version__):
    return click.version_option(version, *(decls or ("--version",)), prog_name=prog)


def _typed(param: str) -> bool:
    """Whether the user typed ``param`` on the command line (not a default, not an environment variable)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(param) == ParameterSource.COMMANDLINE


def _apply(f, options):
    for opt in reversed(options):
        f = opt(f)
    return f


# --- what to run ---------------------------------------------------------------------

def model_options(f):
    """--model_file, --model_name, --core_id (hrt_model_exec's spelling, as on the board)."""
    return _apply(f, [
        click.option("--model_file", required=True, help="Model file(s), comma separated."),
        click.option("--model_name", default="", help="Model to use when the files hold several."),
        click.option("--core_id", default=0, show_default=True, type=click.IntRange(0, 2), help="BPU core (0: any)."),
    ])


# --- where it runs -------------------------------------------------------------------

BOARD_HELP = ("the hrt_boardd at HOST:PORT (or grpc://HOST:PORT); several boards comma separated (a:p,b:p), or @FILE "
              "listing one per line")


def board_option(*decls: str, help: str = "", multiple: bool = False, metavar: str = "HOST:PORT[,...]|@FILE"):
    """The board list option: ``HOST:PORT[,HOST:PORT...]`` or ``@FILE`` (bpuemu.board.farm.board_entries)."""
    return click.option(*(decls or ("--board",)), "board", default=() if multiple else "", multiple=multiple,
                        metavar=metavar, help=help or f"Run on {BOARD_HELP}, instead of in-process.")


def typed_flags(*names: str) -> List[str]:
    """The flags among parameters ``names`` that the user typed (not defaults, not environment variables)."""
    ctx = click.get_current_context()
    return [max(p.opts, key=len) for p in ctx.command.params
            if p.name in names and _typed(p.name)]


def refuse(flags: List[str], why: str) -> None:
    """A flag that cannot apply is a usage error naming it, never silently dropped."""
    if flags:
        raise click.UsageError(f"{flags[0]} {why}")


def token_option(f):
    """--token-file, gathered into ``token`` (the file's token, else $BPUEMU_TOKEN, else None)."""

    @functools.wraps(f)
    def wrapper(*args, token_file, **kwargs):
        from bpuemu.board.security import client_token

        kwargs["token"] = client_token(token_file)
        return f(*args, **kwargs)

    return click.option("--token-file", "token_file", default="",
                        help="Token for a board that requires one (or set BPUEMU_TOKEN).")(wrapper)


def tls_options(f):
    """--tls-ca/--tls-cert/--tls-key/--tls-server-name, gathered into one ``tls`` argument (TlsConfig or None)."""

    @functools.wraps(f)
    def wrapper(*args, tls_ca, tls_cert, tls_key, tls_server_name, **kwargs):
        from bpuemu.board.security import TlsConfig

        kwargs["tls"] = TlsConfig.from_options(tls_ca, tls_cert, tls_key, tls_server_name)
        return f(*args, **kwargs)

    return _apply(wrapper, [
        click.option("--tls-ca", "tls_ca", default="", metavar="FILE",
                     help="Use TLS; trust boards whose certificate this CA signed (or set BPUEMU_TLS_CA)."),
        click.option("--tls-cert", "tls_cert", default="", metavar="FILE",
                     help="Client certificate for a board that requires one (mTLS; or set BPUEMU_TLS_CERT)."),
        click.option("--tls-key", "tls_key", default="", metavar="FILE", help="Key of --tls-cert (or set BPUEMU_TLS_KEY)."),
        click.option("--tls-server-name", "tls_server_name", default="", metavar="NAME",
                     help="Name the board's certificate must carry, when not the board's host."),
    ])


#: Hints in the connection flags' own spelling, for library errors about a subject (bpuemu.board.cli.edge).
CONNECTION_HINTS = {
    "tls": "check --tls-ca (the CA that signed the board's certificate), --tls-server-name, and, for a board that "
           "requires client certificates, --tls-cert/--tls-key",
    "unreachable_plain": "{hint} (--tls-ca FILE)",
    "ssh_identity": "load the key into ssh-agent and omit --identity, or use an unencrypted key",
    "remote_command": "install the board package there (deploy/), or pass --remote-command",
}


#: Parameters that only mean something for a board running hrt_boardd (gRPC) ...
GRPC_PARAMS = ("token_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name")
#: ... and for a board reached over SSH.
SSH_PARAMS = ("username", "password", "identity", "known_hosts", "accept_new_host_key", "remote_command", "remote_tmp")


def ssh_login_options(f):
    """How to log in to a board over SSH, gathered into ``ssh_settings`` (the ssh transport's settings)."""

    @functools.wraps(f)
    def wrapper(*args, password, identity, known_hosts, accept_new_host_key, remote_command, remote_tmp, **kwargs):
        kwargs["ssh_settings"] = dict(password=password or None, identity=identity or None,
                                      known_hosts=known_hosts or None, accept_new_host_key=accept_new_host_key,
                                      remote_command=remote_command, remote_tmp=remote_tmp)
        return f(*args, **kwargs)

    return _apply(wrapper, [
        click.option("-p", "--password", default="", envvar="BPUEMU_SSH_PASSWORD",
                     help="Board password (SSH; or set BPUEMU_SSH_PASSWORD). Omit when the board has none or uses keys."),
        click.option("--identity", default="", metavar="FILE", help="SSH private key file."),
        click.option("--known-hosts", "known_hosts", default="", metavar="FILE",
                     help="known_hosts file checked for the board's host key [default: ~/.ssh/known_hosts]."),
        click.option("--accept-new-host-key", "accept_new_host_key", is_flag=True,
                     help="Trust and record a board host key that known_hosts lacks (a changed key is always refused)."),
        click.option("--remote-command", "remote_command", default="hrt_model_exec", show_default=True,
                     help="How to run hrt_model_exec on the board."),
        click.option("--remote-tmp", "remote_tmp", default="/tmp", show_default=True, metavar="DIR",
                     help="Directory on the board where each session's work dir is made (for a board whose /tmp "
                          "is small or noexec)."),
    ])


def ssh_options(f):
    """--ssh USER@HOST[:PORT] and the SSH login group, gathered into ``ssh`` (a TransportRequest, or None).

    With --ssh the gRPC flags (--token-file, --tls-*) cannot apply; without it
    the SSH login flags cannot: either is a usage error naming the flag.
    """

    @functools.wraps(f)
    def wrapper(*args, ssh_target, ssh_settings, **kwargs):
        from bpuemu.board.backends import TransportRequest

        if ssh_target:
            refuse(typed_flags(*GRPC_PARAMS), "applies to a board running hrt_boardd (--board), not to --ssh")
            if kwargs.get("board"):
                raise click.UsageError("--ssh takes one board; give either --ssh or --board (hrt_boardd, gRPC), not both")
            kwargs["ssh"] = TransportRequest("ssh", ssh_target, ssh_settings)
        else:
            refuse(typed_flags(*SSH_PARAMS), "only applies with --ssh USER@HOST[:PORT]")
            kwargs["ssh"] = None
        return f(*args, **kwargs)

    wrapper = ssh_login_options(wrapper)
    return click.option("--ssh", "ssh_target", default="", metavar="USER@HOST[:PORT]",
                        help="Run on a board over SSH (port 22 by default): upload the model, run hrt_model_exec "
                             "there.")(wrapper)


def connection_options(f):
    """Where the model runs: --board (gRPC, one or several), --token-file, TLS, or --ssh."""
    f = token_option(f)
    f = tls_options(f)
    f = ssh_options(f)  # outermost: it checks which of the other groups' flags can apply
    return board_option()(f)


def split_list(value: str) -> List[str]:
    """``a,b, c`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]

"""Who may talk to a board, and over what: tokens and TLS, for hrt_boardd and every client.

Tokens. The daemon reads its token from ``--token-file``; clients from their
own ``--token-file`` or, failing that, the ``BPUEMU_TOKEN`` environment
variable. A token travels as ``authorization: Bearer <token>`` call metadata
(and in the data channel's HELLO frame) and is compared with
``hmac.compare_digest``. Tokens are printable ASCII (gRPC metadata is) of at
least 16 characters.

TLS. ``ServerTls`` (hrt_boardd ``--tls-cert --tls-key [--tls-ca]``): the board
presents its certificate; with ``--tls-ca`` it also requires a client
certificate signed by that CA (mTLS). ``TlsConfig`` (clients ``--tls-ca
[--tls-cert --tls-key] [--tls-server-name]``): the client verifies the board
against ``--tls-ca`` (the system's roots when omitted), checks that the
certificate names the host it dialled (or ``--tls-server-name``), and presents
its own certificate for mTLS. Clients also read ``BPUEMU_TLS_CA``,
``BPUEMU_TLS_CERT``, ``BPUEMU_TLS_KEY`` and ``BPUEMU_TLS_SERVER_NAME``.

The same files configure gRPC (``grpc.ssl_*_credentials``) and the infer data
channel (an ``ssl.SSLContext``, see bpuemu.board.daemon.datachannel). Both are
built, and so the files are checked, when a server or client is made: a
missing file, a key that does not match its certificate or a file that is not
PEM is one clear error at start, not a failed handshake later.

Warnings (logged, the work goes on): the board's token file or private key
readable by users other than its owner (``warn_if_others_can_read``), and a client that
sends its token without TLS to a board beyond loopback (``warn_if_token_in_clear``).
"""
import logging
import os
import ssl
import stat
from dataclasses import dataclass
from typing import List, Optional, Tuple

from bpuemu.common.errors import InvalidInput, read_text_file
from bpuemu.common.wire import is_loopback_host

log = logging.getLogger("bpuemu.board.security")
_warned = set()  # the files already warned about in this process

#: Environment variables clients read when no flag is given.
TOKEN_ENV = "BPUEMU_TOKEN"
TLS_ENV = {"ca_file": "BPUEMU_TLS_CA", "cert_file": "BPUEMU_TLS_CERT", "key_file": "BPUEMU_TLS_KEY",
           "server_name": "BPUEMU_TLS_SERVER_NAME"}

MIN_TOKEN_CHARS = 16


def check_token(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidInput(f"token in {source} is too short ({len(token)} chars); use at least {MIN_TOKEN_CHARS}")
    if not all(33 <= ord(c) < 127 for c in token):
        raise InvalidInput(f"token in {source} must be printable ASCII without spaces (gRPC metadata is ASCII)",
                           hint="make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return token


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace stripped); "" when path is empty."""
    if not path:
        return ""
    return check_token(read_text_file(path, "token file").strip(), path)


def warn_if_others_can_read(path: str, what: str) -> None:
    """Log a warning (once per file) when ``path`` is readable by its group or by others: a secret in it is not."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH) and path not in _warned:
        _warned.add(path)
        log.warning("%s %s is readable by other users (mode %03o); make it private: chmod 600 %s",
                    what, path, stat.S_IMODE(mode), path)


def warn_if_token_in_clear(hosts: List[str], token: Optional[str], tls: Optional["TlsConfig"]) -> None:
    """Log a warning when a client sends ``token`` without TLS to a board beyond loopback."""
    if not token or tls is not None:
        return
    remote = [h for h in hosts if not is_loopback_host(h)]
    if remote:
        log.warning("sending the board token in clear (no TLS) to %s: anyone on the network path can read it; "
                    "use --tls-ca (the board's hrt_boardd --tls-cert/--tls-key)", ", ".join(remote[:4]))


def client_token(token_file: str = "") -> Optional[str]:
    """A client's token: from ``token_file`` if given, else $BPUEMU_TOKEN, else None."""
    if token_file:
        return read_token_file(token_file)
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}") from None


def _ssl_error(what: str, exc: ssl.SSLError) -> InvalidInput:
    reason = getattr(exc, "reason", None) or str(exc)
    return InvalidInput(f"cannot use {what}: {reason}", hint="give PEM files: a certificate, its own private key, a CA certificate")


@dataclass(frozen=True)
class ServerTls:
    """The board's side of TLS: its certificate and key, and the CA of client certificates (mTLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""  # set: clients must present a certificate signed by this CA

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)

    def ssl_context(self) -> ssl.SSLContext:
        """For the data channel; building it also checks the files."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except FileNotFoundError as exc:
            raise InvalidInput(f"cannot read --tls-cert/--tls-key: {exc.filename or self.cert_file}: {exc.strerror}") from None
        except ssl.SSLError as exc:
            raise _ssl_error(f"--tls-cert {self.cert_file} with --tls-key {self.key_file}", exc) from None
        warn_if_others_can_read(self.key_file, "--tls-key")
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except FileNotFoundError:
                raise InvalidInput(f"cannot read --tls-ca {self.client_ca_file}: no such file") from None
            except ssl.SSLError as exc:
                raise _ssl_error(f"--tls-ca {self.client_ca_file}", exc) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def grpc_credentials(self):
        import grpc

        self.ssl_context()  # the clear error for bad files, before gRPC's C core sees them
        ca = _read(self.client_ca_file, "--tls-ca") if self.client_ca_file else None
        pair = (_read(self.key_file, "--tls-key"), _read(self.cert_file, "--tls-cert"))
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=self.mutual)


@dataclass(frozen=True)
class TlsConfig:
    """A client's side of TLS: whom to trust, its own certificate (mTLS), the name to verify."""

    ca_file: str = ""      # empty: the system's trusted roots
    cert_file: str = ""    # with key_file: the client certificate an mTLS board asks for
    key_file: str = ""
    server_name: str = ""  # verify the board's certificate against this name, not the dialled host

    def __post_init__(self):
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidInput("--tls-cert and --tls-key go together (a client certificate and its key)")

    @classmethod
    def from_env(cls) -> Optional["TlsConfig"]:
        """From BPUEMU_TLS_*; None when none is set."""
        values = {field: os.environ.get(var, "") for field, var in TLS_ENV.items()}
        return cls(**values) if any(values.values()) else None

    @classmethod
    def from_options(cls, ca_file: str = "", cert_file: str = "", key_file: str = "",
                     server_name: str = "") -> Optional["TlsConfig"]:
        """From client flags; the environment when no flag is given; None: plain TCP."""
        if ca_file or cert_file or key_file or server_name:
            return cls(ca_file, cert_file, key_file, server_name)
        return cls.from_env()

    def ssl_context(self) -> ssl.SSLContext:
        """For the data channel; building it also checks the files."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if self.ca_file:
                ctx.load_verify_locations(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except FileNotFoundError as exc:
            raise InvalidInput(f"cannot read a TLS file: {exc.filename or self.ca_file}: {exc.strerror}") from None
        except ssl.SSLError as exc:
            raise _ssl_error(f"--tls-ca {self.ca_file or '(system)'} / --tls-cert {self.cert_file or '-'}", exc) from None
        return ctx

    def grpc_credentials(self):
        import grpc

        self.ssl_context()
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "--tls-ca") if self.ca_file else None,
            private_key=_read(self.key_file, "--tls-key") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "--tls-cert") if self.cert_file else None,
        )

    def channel_options(self, default_name: str = "") -> List[Tuple[str, str]]:
        """gRPC options for the name checked against the board's certificate."""
        name = self.server_name or default_name
        return [("grpc.ssl_target_name_override", name)] if name else []

    def hostname_for(self, host: str) -> str:
        return self.server_name or host

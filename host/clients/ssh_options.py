"""How to reach a board over SSH: the SSH transport's options (host-only).

``bpuemu.host.clients.ssh`` uses them; the board's command line hands them
over as a ``TransportRequest`` (``SshOptions.from_request``), since the board
never imports the host.
"""
from dataclasses import dataclass, fields
from typing import Optional


@dataclass
class SshOptions:
    """How to reach a board over SSH (the ``ssh`` transport plugin's options).

    ``target`` is ``[user@]host[:port]``; the user defaults to root and the
    port to 22. Host keys are checked against ``known_hosts``; an unknown key
    is refused unless ``accept_new_host_key`` (then it is recorded there).
    """

    target: str
    password: Optional[str] = None
    identity: Optional[str] = None
    known_hosts: Optional[str] = None  # None: ~/.ssh/known_hosts
    accept_new_host_key: bool = False
    remote_command: str = "hrt_model_exec"
    user: Optional[str] = None  # overrides a user given in target
    connect_timeout_s: float = 10.0  # connect, authenticate, and each SFTP operation
    command_timeout_s: float = 300.0  # each remote command (perf adds its run time)
    remote_tmp: str = "/tmp"  # where the per-session work dir is made on the board

    @classmethod
    def from_request(cls, request) -> "SshOptions":
        """From a bpuemu.board.backends.TransportRequest (target + settings named as the fields here)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(request.settings) - known)
        if unknown:
            raise TypeError(f"unknown SSH settings: {', '.join(unknown)}")
        return cls(target=request.target, **dict(request.settings))

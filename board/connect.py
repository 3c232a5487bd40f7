"""Open the models where they run: this process, one board, every board of a list (a farm), or a
transport plugin (SSH).

    with open_backend(["m.bin"], board="127.0.0.1:9473") as be:       # a RemoteBackend
        h = be.model("")

It sits above both ``backends`` (the one interface, and the in-process and one-board backends) and
``farm`` (many boards, built on that interface), since it chooses among them.
"""
from typing import Optional, Sequence, Union

from bpuemu.common.errors import InvalidInput
from bpuemu.board.backends import Backend, LocalBackend, RemoteBackend, TransportRequest, load_transport
from bpuemu.board.farm import BoardAccess, FarmClient


def open_backend(model_files: Sequence[str], board: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
                 ssh: Optional[TransportRequest] = None, tls=None, client_name: str = "hrt_model_exec") -> Backend:
    """The models opened where they run: this process (no board), one board, or every board of a list (a farm).

    ``board``: one HOST:PORT, or a list of them (several: a FarmClient).
    """
    files = [f for f in model_files if f]
    if not files:
        raise InvalidInput("no model file given", subject="model_file")
    boards = [board] if isinstance(board, str) else list(board or [])
    if ssh is not None:
        if boards:
            raise InvalidInput("give either --board (gRPC) or --ssh, not both")
        return load_transport(ssh.transport).open(ssh, files)
    if len(boards) > 1:
        return FarmClient(boards, files, BoardAccess(token=token, tls=tls, client_name=client_name))
    return RemoteBackend(boards[0], files, token, tls, client_name=client_name) if boards else LocalBackend(files)

"""The bpuemu error vocabulary.

Every user-facing failure is a ``BpuEmuError``: one line that says what is
wrong, optionally a ``hint`` that says what to do, and a ``subject`` that the
CLI edge turns into a hint in the flags of the command that was typed (a
library message names no flag: hrt_model_exec says ``--input_file``,
hb_verifier ``-i``). Each boundary translates
them exactly once: the daemon's interceptor to a gRPC status
(``grpc_status`` names the code), the board client back from the status, and
the CLI edge to one printed line and a non-zero exit.
"""
import re


class BpuEmuError(Exception):
    """Base of all user-facing errors."""

    #: Name of the grpc.StatusCode this error travels as.
    grpc_status = "INTERNAL"
    #: Process exit code at the CLI edge.
    exit_code = 1

    def __init__(self, message: str, hint: str = "", subject: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: What the error is about, for the CLI edge to hint in the typed command's own flags
        #: ("model_name", "input_file", ...): library messages name no flag.
        self.subject = subject

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nHint: {self.hint}"


class InvalidModelFile(BpuEmuError):
    """A `.bin` that is corrupt, truncated, or not a bpuemu model."""

    grpc_status = "INVALID_ARGUMENT"


class IncompatibleVersion(BpuEmuError):
    """Host, daemon and model format do not fit together."""

    grpc_status = "FAILED_PRECONDITION"


class InvalidInput(BpuEmuError):
    """Input data of the wrong size, shape, dtype or kind, or a bad argument."""

    grpc_status = "INVALID_ARGUMENT"


class NotFound(BpuEmuError):
    """An unknown model, model name or file."""

    grpc_status = "NOT_FOUND"


class ResourceExhausted(BpuEmuError):
    """A limit was hit (upload size, concurrent jobs, message size)."""

    grpc_status = "RESOURCE_EXHAUSTED"


class Cancelled(BpuEmuError):
    """The caller stopped the job."""

    grpc_status = "CANCELLED"


class BoardUnavailable(BpuEmuError):
    """The board cannot be reached, or went away mid-call."""

    grpc_status = "UNAVAILABLE"


class DeadlineExceeded(BpuEmuError):
    grpc_status = "DEADLINE_EXCEEDED"


class PermissionDenied(BpuEmuError):
    grpc_status = "PERMISSION_DENIED"


class Unauthenticated(BpuEmuError):
    grpc_status = "UNAUTHENTICATED"


class InternalError(BpuEmuError):
    """A bug in bpuemu: the message says where to report it."""

    grpc_status = "INTERNAL"


#: gRPC status name -> error class, for clients translating a status back.
BY_GRPC_STATUS = {
    cls.grpc_status: cls
    for cls in (
        InvalidInput,
        IncompatibleVersion,
        NotFound,
        ResourceExhausted,
        Cancelled,
        BoardUnavailable,
        DeadlineExceeded,
        PermissionDenied,
        Unauthenticated,
        InternalError,
    )
}


def read_text_file(path: str, what: str) -> str:
    """The text of a small file the user named (``what``: "token file", "board list"); InvalidInput when unreadable."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} {path} is not text") from None


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/])(?:/[^\s'\"/:,;()\[\]]+)+/")


def without_paths(text: str) -> str:
    """``text`` with the directories of every absolute path taken out (``/srv/models/ab.bin`` -> ``ab.bin``):
    what a server tells its callers must not map its file system."""
    return _ABSOLUTE_PATH.sub("", text)

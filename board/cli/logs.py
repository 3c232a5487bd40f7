"""The one logging setup of every bpuemu command (entry points only; never at import).

The seed's log lines look like ``2022-04-21 18:22:30,207 INFO Nodes that can
be deleted: [...]`` (SEED_FORMAT); the daemon also names the logger
(DAEMON_FORMAT). Warnings from libraries (an unknown SSH host key from the SSH
transport, a yaml key bpuemu does not act on) are ordinary ``logging``
warnings and reach the user through the handlers set here, as do Python
``warnings`` (captured).
"""
import logging
import sys
from typing import Optional

#: hb_mapper, hb_verifier, hb_perf, ...: "2022-04-21 18:22:30,207 INFO message".
SEED_FORMAT = "%(asctime)s %(levelname)s %(message)s"
#: hrt_boardd and hrt_model_exec: which part of the board spoke.
DAEMON_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Third-party loggers that would drown the user's lines.
_QUIET = {"onnxruntime": logging.ERROR, "paramiko": logging.WARNING, "matplotlib": logging.WARNING,
          "PIL": logging.WARNING}


def setup_logging(level: str = "INFO", log_file: Optional[str] = None, fmt: str = SEED_FORMAT,
                  file_mode: str = "w") -> None:
    """Log to stderr (and ``log_file``, rewritten each run) at ``level``, replacing earlier handlers."""
    formatter = logging.Formatter(fmt)
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode=file_mode))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        h.setFormatter(formatter)
        root.addHandler(h)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    for name, quiet in _QUIET.items():
        logging.getLogger(name).setLevel(quiet)
    logging.captureWarnings(True)

"""Boards on a real network for the tests: bench/netlab.py's Lab (each hrt_boardd in its own network namespace
behind an emulated link; see that module for what each link profile does and how).

``lab(profiles, tmp_path)`` skips the test with one line saying why when namespaces cannot be made here, and fails
it instead under CI=true (CI runs as root, where they can).
"""
import contextlib
import pathlib
import sys
from typing import Iterator, Sequence

from helpers.installed import require

BENCH = pathlib.Path(__file__).resolve().parent.parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import netlab  # noqa: E402  (bench/netlab.py)


def require_namespaces() -> None:
    require(netlab.unavailable())


@contextlib.contextmanager
def lab(profiles: Sequence[str], workdir, **kwargs) -> Iterator["netlab.Lab"]:
    """A started Lab over ``profiles`` (its stores and logs under ``workdir``), torn down on leaving."""
    require_namespaces()
    with netlab.Lab(profiles, workdir=str(workdir), **kwargs) as started:
        yield started

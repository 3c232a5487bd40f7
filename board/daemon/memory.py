"""The daemon's native heap on glibc: two malloc arenas, and free pages handed back after an unload.

glibc's malloc gives each new thread that allocates an arena of its own, up to 8 per core; a
daemon's threads (gRPC's 16 workers, one per data channel connection, perf jobs, upload timers)
then spread their memory over as many heaps, each keeping the pages freed inside it resident,
for its own threads only. A soak of the default daemon (bench/soak.py) had 15 arena heaps
after one minute.

- ``limit_arenas`` caps the arenas at two (``mallopt(M_ARENA_MAX)``, as ``MALLOC_ARENA_MAX=2``
  would); an operator's own ``MALLOC_ARENA_MAX`` wins. hrt_boardd calls it first thing.
- ``trim`` (``malloc_trim(0)``) hands the free pages inside every arena back to the kernel;
  BoardState.unload calls it once the model's sessions are freed (they are freed among memory
  still in use, and their holes would stay resident).

Both do nothing where the C library is not glibc (musl, macOS).
"""
import ctypes
import os
import threading
from typing import Optional

#: mallopt's parameter number for the arena cap (glibc's malloc.h).
M_ARENA_MAX = -8
#: The daemon's arena cap: the main arena and one more, shared by all its other threads.
ARENAS = 2

_glibc_lock = threading.Lock()
_glibc_handle: Optional[ctypes.CDLL] = None
_looked = False


def glibc() -> Optional[ctypes.CDLL]:
    """This process's C library when it is glibc (it has gnu_get_libc_version and malloc_trim), else None."""
    global _glibc_handle, _looked
    with _glibc_lock:
        if not _looked:
            _looked = True
            try:
                libc = ctypes.CDLL(None)
                if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt"):
                    libc.malloc_trim.argtypes = [ctypes.c_size_t]
                    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                    _glibc_handle = libc
            except OSError:
                pass
        return _glibc_handle


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` unless MALLOC_ARENA_MAX is set; True when capped here.

    Best called before the daemon starts its threads (arenas already made stay)."""
    libc = glibc()
    if libc is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return libc.mallopt(M_ARENA_MAX, arenas) == 1


def trim() -> None:
    """Hand the free pages of every malloc arena back to the kernel (glibc's malloc_trim(0))."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)

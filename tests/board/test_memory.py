"""The daemon's native heap: hrt_boardd keeps glibc's malloc arenas few (bpuemu.board.daemon.memory).

A soak's RSS crept up by MBs an hour with Python's heap flat: each of the daemon's threads had a
malloc arena of its own (15 in a soak of the default daemon), each keeping the free pages in its
holes. These tests count the arenas' heaps in a real daemon's /proc/PID/maps after it served calls
from many threads at once.
"""
import platform
import threading

import pytest

from bpuemu.board.client import BoardClient
from bpuemu.board.daemon import memory

from boardd_harness import clean_env

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="malloc arenas are glibc's")

#: glibc's heap of a non-main arena: a mapping of this size, aligned to it (HEAP_MAX_SIZE on 64-bit).
HEAP_BYTES = 64 << 20


def arena_heaps(pid: int) -> int:
    """Heaps of glibc's non-main malloc arenas in a process: anonymous mappings aligned to 64 MiB whose
    read-write start and inaccessible rest (reserved, not yet used) span 64 MiB."""
    maps = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            maps.append((lo, hi, parts[1], parts[5] if len(parts) > 5 else ""))
    heaps = 0
    for i, (lo, hi, perms, path) in enumerate(maps):
        if path or lo % HEAP_BYTES or not perms.startswith("rw"):
            continue
        end = hi
        for lo2, hi2, perms2, path2 in maps[i + 1:]:
            if lo2 != end or path2 or not perms2.startswith("---"):
                break
            end = hi2
        heaps += end - lo >= HEAP_BYTES
    return heaps


def busy_from_many_threads(daemon, model, threads: int = 10, calls: int = 15) -> None:
    """``threads`` clients at once, each running ``calls`` gRPC infers: the daemon serves them on as many threads."""
    with daemon.client() as c:
        sha = c.ensure_model(model.path)
        c.load(sha)
    start = threading.Barrier(threads)
    errors = []

    def client():
        try:
            with BoardClient(daemon.target, data_channel=False) as board:
                board.info
                start.wait(timeout=30)
                for _ in range(calls):
                    board.infer(sha, "", [model.x])
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not errors, errors[0]


@glibc_only
def test_the_daemon_keeps_two_malloc_arenas_however_many_threads_serve(start_daemon, rgb_model):
    """Served from ten threads at once, hrt_boardd has one arena besides the main one (a second heap of it
    at most); an operator's own MALLOC_ARENA_MAX wins, and with glibc's default the same calls leave an
    arena per serving thread (which is what the count must see)."""
    capped = start_daemon("--max-jobs", "16")
    busy_from_many_threads(capped, rgb_model)
    heaps = arena_heaps(capped.proc.pid)
    assert 1 <= heaps <= 2, f"hrt_boardd has {heaps} malloc arena heaps after serving 10 threads (cap: {memory.ARENAS} arenas)"

    uncapped = start_daemon("--max-jobs", "16", env=clean_env(MALLOC_ARENA_MAX="16"))
    busy_from_many_threads(uncapped, rgb_model)
    assert arena_heaps(uncapped.proc.pid) >= 4



def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@glibc_only
def test_unloading_a_model_hands_the_heaps_free_pages_back(tmp_path, rgb_model):
    """Unloading a model frees its sessions among memory still in use, in holes glibc keeps resident; the unload
    hands those pages back to the kernel (malloc_trim). Here the holes are made on purpose: 60 MB of blocks
    freed between kept ones."""
    import shutil

    from bpuemu.board.daemon.state import BoardState
    from bpuemu.common.container import file_sha256

    sha = file_sha256(rgb_model.path)
    (tmp_path / "models").mkdir()
    shutil.copy(rgb_model.path, tmp_path / "models" / f"{sha}.bin")
    state = BoardState(str(tmp_path / "models"))
    state.load(sha)
    blocks = [bytearray(4000) for _ in range(16_000)]  # malloc'd by glibc (over pymalloc's 512 bytes), touched
    kept = blocks[::8]
    del blocks  # 7 of 8 freed, each between two kept: holes, not the heap's top
    before = _rss_mb()
    assert state.unload(sha)
    after = _rss_mb()
    assert before - after > 30, f"RSS {before:.1f} MB before the unload, {after:.1f} MB after"
    assert len(kept) == 2000

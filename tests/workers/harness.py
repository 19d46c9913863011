"""Shared helpers for tests/test_runtime*.py: task builders and leak checks."""

import os
import time

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


def shm_segments():
    """Named segments made by daisy_nb (only where it cannot use a memfd; tests force that path) that
    are this test's: made by this process or one it started, or left by a process that is gone (a
    leak). A segment of another live process is not: with ``pytest -n`` the tests run in parallel
    (pytest-xdist), and another test worker's run may hold one at the moment this one looks."""
    from daisy_nb.runtime.local._shm import NAME_PREFIX

    try:
        names = {n for n in os.listdir("/dev/shm") if n.startswith(NAME_PREFIX)}
    except FileNotFoundError:  # pragma: no cover - not Linux
        return set()
    if not names:
        return names
    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    mine = set()
    for n in names:
        pid = _creator(n, NAME_PREFIX)
        if pid is None or pid in ours or not pid_alive(pid):  # (a name without its maker: the test's)
            mine.add(n)
    return mine


def _creator(name: str, prefix: str) -> int | None:
    """The pid in a segment's name (``dnb_<pid>_<random>``), None if it has none."""
    head, sep, _ = name[len(prefix) :].partition("_")
    return int(head) if head.isdigit() and sep else None


def memfd_mappings():
    """This process's mappings of worker segments (memfd), which the pool must unmap when a worker ends."""
    from daisy_nb.runtime.local._shm import MEMFD_NAME

    try:
        with open("/proc/self/maps") as f:
            return [line for line in f if MEMFD_NAME in line]
    except FileNotFoundError:  # pragma: no cover - not Linux
        return []


def _is_tracker(p):
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except Exception:
        return True


def children():
    """Descendants of this process, minus multiprocessing's long-lived resource tracker."""
    me = psutil.Process()
    out = set()
    for p in me.children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _is_tracker(p):
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_no_leaks(before_children, before_shm, wait=3.0):
    deadline = time.monotonic() + wait
    while True:
        left = children() - before_children
        shm = shm_segments() - before_shm
        if (not left and not shm) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"child processes left behind: {left}"
    assert not shm, f"shared-memory segments left behind: {shm}"
    maps = memfd_mappings()
    assert not maps, f"worker segments still mapped: {maps}"


def pid_alive(pid):
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive_after(pids, wait=3.0):
    """The processes of ``pids`` still alive once they all ended or ``wait`` seconds passed (polled)."""
    deadline = time.monotonic() + wait
    while (left := {p for p in pids if pid_alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left

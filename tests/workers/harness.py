"""Shared helpers for tests/test_runtime*.py: task builders and leak checks."""
import os
import time

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


def shm_segments():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}
    except FileNotFoundError:  # pragma: no cover - not Linux
        return set()


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


def pid_alive(pid):
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

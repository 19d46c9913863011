"""The leak checks themselves (``tests/workers/harness.py``): what they count as a test's leak.

The suite runs in parallel (pytest-xdist), so a named shared-memory segment in ``/dev/shm`` may
belong to another test worker's run at the moment a test looks. A segment is the test's when
its process, or a process it started, made it, or when its maker is gone (a leak nobody will
unlink); a segment another live process made is not. The library names its segments with
their maker's pid for that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing import shared_memory

import harness
import pytest

from daisy_nb.runtime.local import _shm

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="named segments live in /dev/shm (Linux)")


def _make(name: str) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name, create=True, size=64)  # unlinked by the test (``unlink``)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_segment_counts_as_the_tests_unless_another_live_process_made_it():
    tag = os.urandom(3).hex()
    names = {
        "mine": f"{_shm.NAME_PREFIX}{os.getpid()}_{tag}",
        "maker gone": f"{_shm.NAME_PREFIX}{_dead_pid()}_{tag}",
        "no maker in the name": f"{_shm.NAME_PREFIX}{tag}",
        "another live process": f"{_shm.NAME_PREFIX}1_{tag}",  # init: alive, not started by this test
    }
    segs = [_make(n) for n in names.values()]
    try:
        seen = harness.shm_segments()
        assert names["mine"] in seen
        assert names["maker gone"] in seen
        assert names["no maker in the name"] in seen
        assert names["another live process"] not in seen
    finally:
        for s in segs:
            s.close()
            s.unlink()
    assert not set(names.values()) & harness.shm_segments()


def test_a_segment_made_by_a_child_counts_while_the_child_runs():
    """A run in a program the test started: its segments are the test's (a leak of that program)."""
    code = (
        "import sys\n"
        "from multiprocessing import shared_memory\n"
        f"s = shared_memory.SharedMemory({_shm.NAME_PREFIX!r} + str(__import__('os').getpid()) + '_c', create=True, size=64)\n"
        "print(s.name, flush=True)\n"
        "sys.stdin.readline()\n"
        "s.close(); s.unlink()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name = p.stdout.readline().strip()
        assert name.startswith(f"{_shm.NAME_PREFIX}{p.pid}_")
        assert name in harness.shm_segments()
    finally:
        p.communicate("\n", timeout=30)
    assert name not in harness.shm_segments()


def test_the_pool_names_a_named_segment_after_its_maker(monkeypatch):
    """Where there is no memfd (tests force that path), a worker's segment is ``dnb_<pid>_<random>``,
    short enough for macOS's 31-character limit on names."""
    monkeypatch.delattr(os, "memfd_create")
    seg = _shm.Segment(4096)
    try:
        assert seg.name is not None
        name = seg.name.lstrip("/")
        assert name.startswith(f"{_shm.NAME_PREFIX}{os.getpid()}_")
        assert len("/" + name) <= 31
        assert name in harness.shm_segments()
    finally:
        seg.close()
    assert name not in harness.shm_segments()

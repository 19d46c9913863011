"""What a finished run leaves in the scheduler's process: none of its per-block state, and the
memory it freed handed back to the system.

A Scheduler holds ~12 bytes a block (49 MiB for a 4.1M-block 3-D run). The worker pool's parts
reference one another and the Scheduler, so without a collection that state waits for Python's
next full garbage collection, which a program's next phase (numpy work, a check of the result)
may not trigger for a long time. These tests run with automatic collection off.
"""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import daisy_nb
from daisy_nb import Roi, run
from daisy_nb.scheduler import Scheduler

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


def _noop(block) -> None:
    pass


def _schedulers() -> int:
    """Live Schedulers (by ``type()``: ``isinstance`` raises ReferenceError on a weak proxy whose
    object is gone, and other tests leave such proxies to the collector)."""
    return sum(1 for o in gc.get_objects() if issubclass(type(o), Scheduler))


@pytest.fixture
def no_automatic_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _task(tmp_path, n: int) -> daisy_nb.Task:
    one = Roi((0,), (1,))
    return daisy_nb.Task("t", Roi((0,), (n,)), one, one, process_function=_noop, max_workers=2, tracking_path=False)


def test_a_large_run_frees_its_state_before_run_blockwise_returns(no_automatic_gc, monkeypatch, tmp_path):
    monkeypatch.setattr(run, "COLLECT_AT", 64)  # "large" for this test
    before = _schedulers()
    assert daisy_nb.run_blockwise([_task(tmp_path, 64)], progress=False, summary=False, log_dir=str(tmp_path))
    assert _schedulers() == before


def test_a_run_past_the_threshold_for_real(no_automatic_gc, tmp_path):
    """COLLECT_AT blocks (a million, 1-D, no-op blocks, 2 workers): the collection happens."""
    before = _schedulers()
    task = _task(tmp_path, run.COLLECT_AT)
    assert daisy_nb.run_blockwise([task], progress=False, summary=False, log_dir=str(tmp_path))
    assert _schedulers() == before


_FREED_BELOW_A_LIVE_CHUNK = """
import sys
from daisy_nb.runtime.local._heap import give_back_freed_memory

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024

chunks = [bytes(100_000) for _ in range(640)]  # 64 MB from the heap (below the mmap threshold)
top = bytes(100_000)  # still in use, above them: malloc cannot shrink its heap past it
del chunks
held = rss_mib()
assert give_back_freed_memory()
print(held, rss_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_below_live_memory_goes_back_to_the_system():
    r = subprocess.run([sys.executable, "-c", _FREED_BELOW_A_LIVE_CHUNK], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    held, after = map(float, r.stdout.split())
    assert held - after > 30, (held, after)  # MiB, of the ~61 freed


def test_every_run_hands_back_what_it_freed(monkeypatch, tmp_path):
    from daisy_nb.runtime.local import _heap

    calls = []
    monkeypatch.setattr(_heap, "give_back_freed_memory", lambda: calls.append(1) or True)
    assert daisy_nb.run_blockwise([_task(tmp_path, 8)], progress=False, summary=False, log_dir=str(tmp_path))
    assert calls == [1]

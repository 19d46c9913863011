"""Plain mode's ``surface.step`` (``kernels/surface_plain.py``) in lockstep with the kernel.

Two Schedulers of one pipeline; the same random calls go to the kernel's ``step`` in one
(compiled, or its body run as Python under ``DAISY_NB_JIT=0``) and to ``surface.PLAIN_STEP[0]``
in the other: every result, every block handed out and described, and the whole state (status,
retries, preskip, ``n_met``, FIFO, counters, settings) must be equal after every call. Calls:
one-block and batch acquires and releases with every release code, permanent failures (then
``fail_block`` on both, as the Scheduler does), blocks flagged to skip, abandoned tasks.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import pipeline_configs

import daisy_nb as daisy
import daisy_nb.kernels.surface as ks
import daisy_nb.kernels.tables as kt
from daisy_nb import Roi
from daisy_nb.kernels import _jit, surface_plain


def _scheduler(config) -> daisy.Scheduler:
    tasks = {
        tid: daisy.Task(
            tid,
            Roi(*c["total_roi"]),
            Roi(*c["read_roi"]),
            Roi(*c["write_roi"]),
            read_write_conflict=c["read_write_conflict"],
            fit=c["fit"],
            max_retries=c["max_retries"],
            tracking_path=False,
        )
        for tid, c in config["tasks"].items()
    }
    return daisy.Scheduler(daisy.Pipeline(list(tasks.values()), [(tasks[u], tasks[d]) for u, d in config["edges"]]))


def _reference_step():
    """The kernel: compiled when this process compiles, else its body as Python (the same source)."""
    return ks.step if _jit.compiled() else ks._STEP[0]


def _state(s) -> list:
    n = s.num_blocks_total
    return [s._u8[: 3 * n].tolist(), s.n_met.tolist(), s.queue.tolist(), s.cnt.tolist(), s.tcfg.tolist()]


class _Side:
    """One Scheduler and the ``step`` that drives it; each call returns what a caller sees."""

    def __init__(self, config, step):
        self.s = _scheduler(config)
        self.step = step

    def call(self, op, t, x, y, rows, codes):
        return self.step(self.s._b, self.s._u8, self.s.n_met, op, t, x, y, rows, codes)

    def fail(self, t, row):
        return ks.fail_block(*self.s._groups, t, row)

    def acquire_one(self, t):
        out = np.full(2 + 4 * self.s._ndim[t], -9, np.int64)
        n = self.call(kt.OP_ACQUIRE_ONE, t, 0, 0, out, np.zeros(1, np.uint8))
        return n, out.tolist() if n == 1 else []

    def acquire(self, t, k):
        out = np.full(k, -9, np.int64)
        n = self.call(kt.OP_ACQUIRE, t, k, 0, out, np.zeros(1, np.uint8))
        return n, out[: max(n, 0)].tolist()

    def release_one(self, t, row, code):
        seen = [self.call(kt.OP_RELEASE_ONE, t, row, code, np.zeros(1, np.int64), np.zeros(1, np.uint8))]
        if seen[0] <= kt.RC_FAILED_AT:
            seen.append(self.fail(t, row))
        return seen

    def release(self, t, rows, codes):
        rows, codes = np.array(rows, np.int64), np.array(codes, np.uint8)
        seen, start = [], 0
        while True:  # as Scheduler._release_rows
            rc = self.call(kt.OP_RELEASE, t, start, 0, rows, codes)
            seen.append(rc)
            if rc > kt.RC_FAILED_AT:
                return seen
            start = kt.failed_at(rc)
            seen.append(self.fail(t, int(rows[start])))
            start += 1


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipeline_configs(max_ndim=3), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.2, 0.5]))
def test_plain_step_lockstep_with_kernel(config, seed, fail_p):
    rng = random.Random(seed)
    ref, plain = _Side(config, _reference_step()), _Side(config, ks.PLAIN_STEP[0])
    sides = (ref, plain)
    n_tasks = len(config["tasks"])
    in_flight: list[list[int]] = [[] for _ in range(n_tasks)]
    assert _state(ref.s) == _state(plain.s)

    def code():
        x = rng.random()
        return kt.R_FAILED if x < fail_p else rng.choice((kt.R_SUCCESS, kt.R_SUCCESS, kt.R_SKIPPED, kt.R_GIVE_BACK))

    for _ in range(5_000):
        t = rng.randrange(n_tasks)
        x = rng.random()
        if in_flight[t] and x < 0.3:  # one block back
            row = in_flight[t].pop(rng.randrange(len(in_flight[t])))
            c = code() if rng.random() < 0.9 else kt.R_SUCCESS
            if c == kt.R_GIVE_BACK:
                c = kt.R_SUCCESS  # OP_RELEASE_ONE: the per-block API releases done or failed blocks
            got = [side.release_one(t, row, c) for side in sides]
        elif in_flight[t] and x < 0.55:  # a batch back, some rows not in flight (ignored)
            rng.shuffle(in_flight[t])
            k = rng.randint(1, len(in_flight[t]))
            rows, in_flight[t] = in_flight[t][:k], in_flight[t][k:]
            if rng.random() < 0.2:
                rows.append(rng.randrange(ref.s._nblocks[t]))
            codes = [code() for _ in rows]
            got = [side.release(t, rows, codes) for side in sides]
        elif x < 0.75:
            got = [side.acquire_one(t) for side in sides]
            if got[0][0] == 1:
                in_flight[t].append(got[0][1][0])
        elif x < 0.97:
            k = rng.randint(1, 5)
            got = [side.acquire(t, k) for side in sides]
            in_flight[t] += got[0][1]
        elif x < 0.99:  # a block not handed out yet is to be skipped (recorded done, or masked)
            gi, flag = rng.randrange(ref.s.num_blocks_total), rng.choice((1, 2))
            for side in sides:
                side.s.preskip[gi] = flag
            got = [None, None]
        else:
            got = [side.s.abandon_task(ref.s.task_ids[t], "test") for side in sides]
            in_flight[t] = []
        assert got[0] == got[1]
        assert _state(ref.s) == _state(plain.s)
        if not any(in_flight) and all(ref.s.cnt[u, kt.C_READY] == 0 for u in range(n_tasks)):
            break
    for side in sides:
        assert side.s.is_done()


def test_plain_step_is_what_plain_mode_runs():
    """Plain mode binds ``surface.step`` to the plain twin, and compiled mode back to the kernel."""
    was = _jit.compiled()
    try:
        _jit.use_python()
        assert ks.step is ks.PLAIN_STEP[0]
    finally:
        if was:
            _jit.use_numba()
    assert (ks.step is ks.PLAIN_STEP[0]) is not _jit.compiled()


# -- what plain mode keeps of a Scheduler ------------------------------------------------------
# Plain mode keeps the surface of the last Scheduler that stepped, over that Scheduler's buffers
# (~12 bytes a block). It must go with the Scheduler: a run of 4 million blocks that left it
# behind held ~49 MiB after run_blockwise returned, for the rest of the process.


@pytest.fixture
def plain():
    was = _jit.mode()
    _jit.set_mode("python")
    yield
    _jit.set_mode(was)


def _stepped_scheduler() -> daisy.Scheduler:
    """A Scheduler with a few blocks handed out and released in plain mode."""
    task = daisy.Task("t", Roi((0,), (40,)), Roi((0,), (4,)), Roi((0,), (4,)), tracking_path=False)
    s = daisy.Scheduler(task)
    assert ks.step is ks.PLAIN_STEP[0]
    for _ in range(3):
        block = s.acquire_block("t")
        block.status = daisy.BlockStatus.SUCCESS
        s.release_block(block)
    return s


def _surfaces() -> list:
    """The live plain surfaces (by ``type()``: ``isinstance`` raises ReferenceError on a weak
    proxy whose object is gone, and other tests leave such proxies to the collector)."""
    return [o for o in gc.get_objects() if type(o) is surface_plain.PlainSurface]


def _surfaces_over(b) -> int:
    gc.collect()
    return sum(1 for o in _surfaces() if o.b is b)


def test_a_closed_scheduler_is_not_kept_by_plain_mode(plain):
    s = _stepped_scheduler()
    assert _surfaces_over(s._b) == 1
    s.close()
    assert _surfaces_over(s._b) == 0


def test_a_dropped_scheduler_s_state_is_freed(plain):
    """Closed or not (daisy's programs drive a Scheduler without closing it)."""
    s = _stepped_scheduler()
    state = weakref.ref(s._b)
    del s
    gc.collect()
    assert state() is None


def test_kernel_modules_hold_no_run_state(plain):
    """numba copies the kernel modules' globals when it loads, mid-run in a large run: a
    Scheduler's state held there would outlive the run."""
    s = _stepped_scheduler()
    copied = {fn.__module__ for fn in _jit._kernels}  # what _jit._compiled_twin copies
    assert ks.__name__ in copied
    for name in copied:
        held = [k for k, v in vars(sys.modules[name]).items() if isinstance(v, surface_plain.PlainSurface)]
        assert not held, f"{name} holds {held}"
    s.close()


def test_numba_loading_mid_run_keeps_nothing_of_the_run(tmp_path):
    """In a fresh process: plain steps, then numba loads (its copy of the globals taken while the
    Scheduler is stepping, as in a run that compiles in the background), then the Scheduler goes."""
    prog = """
import gc, weakref
import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.kernels import _jit
import daisy_nb.kernels.surface as ks
_jit.set_mode("python")
s = daisy.Scheduler(daisy.Task("t", Roi((0,), (40,)), Roi((0,), (4,)), Roi((0,), (4,)), tracking_path=False))
for _ in range(3):
    block = s.acquire_block("t")
    block.status = daisy.BlockStatus.SUCCESS
    s.release_block(block)
_jit.use_numba()
assert ks.step is not ks.PLAIN_STEP[0]
block = s.acquire_block("t")
block.status = daisy.BlockStatus.SUCCESS
s.release_block(block)
state = weakref.ref(s._b)
s.close()
del s, block
gc.collect()
print("freed" if state() is None else "kept")
"""
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_JIT"}
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == "freed"


def test_run_blockwise_leaves_no_block_state_behind(plain, tmp_path):
    """A pool run (real workers) in plain mode: nothing of its Scheduler's state is alive after it."""
    task = daisy.Task(
        "t",
        Roi((0,), (64,)),
        Roi((0,), (8,)),
        Roi((0,), (8,)),
        process_function=_noop,
        max_workers=2,
        tracking_path=str(tmp_path / "tracking"),
    )
    assert daisy.run_blockwise([task], progress=False, summary=False, log_dir=str(tmp_path / "logs"))
    gc.collect()
    assert not _surfaces()


def _noop(block) -> None:
    pass

"""SIGKILL during the migration of a grown store, at every step: no lost and no false marks.

A child process opens the store for the grown volume with a step hook that SIGKILLs
it at one named step of the migration (``daisy_nb.tracking._grow`` / ``_io``); the
test then looks at what is on disk and reopens the store, for the grown layout and
for the old one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from daisy_nb.tracking import TrackingStore, read_tracking, task_hash

HERE = Path(__file__).parent

OLD = (((0, 0), (65, 47)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), "shrink")
NEW = (((-10, 0), (95, 60)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), "shrink")

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {root!r})
    from daisy_nb.tracking import _grow, _io, TrackingStore
    _io.USE_EXCHANGE = {exchange!r}
    _grow.PIECE_CELLS = 5  # several pieces per chunk
    kill_at, trace = {kill_at!r}, {trace!r}

    def hook(name):
        with open(trace, "a") as f:
            f.write(name + "\\n")
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    _io.STEP_HOOK = hook
    NEW = {new!r}
    with TrackingStore.open({path!r}, *NEW) as s:
        pass
    print("NOT KILLED")
    """
)


def _child(path: Path, kill_at: str | None, exchange: bool, trace: Path) -> subprocess.CompletedProcess:
    code = CHILD.format(
        root=str(HERE.parent), exchange=exchange, kill_at=kill_at, trace=str(trace), new=NEW, path=str(path)
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _make_store(path: Path):
    rng = np.random.default_rng(11)
    with TrackingStore.open(path, *OLD) as s:
        s.done[...] = rng.random(s.grid_shape) < 0.7
        s.failures[...] = rng.integers(0, 3, s.grid_shape)
        s.mark_dirty()
        return s.done.copy(), s.failures.copy()


def _expected(tmp_path: Path):
    """The migrated arrays, made by an uninterrupted migration of the same store."""
    ref = tmp_path / "ref" / "s"
    ref.parent.mkdir()
    _make_store(ref)
    with TrackingStore.open(ref, *NEW) as s:
        return s.done.copy(), s.failures.copy()


def _steps(tmp_path: Path, exchange: bool) -> list[str]:
    d = tmp_path / f"trace{int(exchange)}"
    d.mkdir()
    p = d / "s"
    _make_store(p)
    trace = d / "trace.txt"
    r = _child(p, None, exchange, trace)
    assert "NOT KILLED" in r.stdout, r.stderr
    return trace.read_text().split()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_sigkill_at_every_step(tmp_path, exchange):
    exp_done, exp_fail = _expected(tmp_path)
    steps = _steps(tmp_path, exchange)
    # the steps of the remap, then of the swap
    must = ["piece-done", "array-done", "piece-failures", "array-failures", "built", "cleaned"]
    assert all(s in steps for s in must), steps
    if not exchange:
        assert "moved-old" in steps and "moved-new" in steps
    old_hash, new_hash = task_hash(*OLD), task_hash(*NEW)
    for i, step in enumerate(dict.fromkeys(steps)):
        for reopen in ("new", "old"):
            d = tmp_path / f"k{int(exchange)}_{i}_{reopen}"
            d.mkdir()
            p = d / "s"
            old_done, old_fail = _make_store(p)
            r = _child(p, step, exchange, d / "trace.txt")
            assert r.returncode == -signal.SIGKILL, (step, r.stdout, r.stderr)
            # on disk, before any recovery: the old store or the new one, whole, never a mix
            meta = json.loads((p / "zarr.json").read_text()) if (p / "zarr.json").exists() else None
            if meta is not None:
                info = read_tracking(p)
                h = meta["attributes"]["daisy_task_hash"]
                if h == old_hash:
                    np.testing.assert_array_equal(info["done"], old_done)
                    np.testing.assert_array_equal(info["failures"], old_fail)
                else:
                    assert h == new_hash
                    np.testing.assert_array_equal(info["done"], exp_done)
                    np.testing.assert_array_equal(info["failures"], exp_fail)
                del info
            else:
                assert step == "moved-old", step  # only between the two renames
            if reopen == "new":
                with TrackingStore.open(p, *NEW) as s:
                    np.testing.assert_array_equal(s.done, exp_done, err_msg=step)
                    np.testing.assert_array_equal(s.failures, exp_fail, err_msg=step)
            else:
                # back to the old layout: fine if the swap had not happened, else the store is
                # the grown one and the old volume is refused as smaller
                swapped = step in ("swapped", "moved-new", "cleaned")
                if swapped:
                    with pytest.raises(RuntimeError, match="shrank"):
                        TrackingStore.open(p, *OLD)
                else:
                    with TrackingStore.open(p, *OLD) as s:
                        np.testing.assert_array_equal(s.done, old_done, err_msg=step)
                        np.testing.assert_array_equal(s.failures, old_fail, err_msg=step)
            leftovers = sorted(x.name for x in d.iterdir() if x.name.startswith(".s."))
            assert leftovers == [], (step, leftovers)


def test_stale_build_is_not_swapped_over_a_new_store(tmp_path):
    """A finished build left beside a store that was deleted and made again is discarded."""
    p = tmp_path / "s"
    _make_store(p)
    trace = tmp_path / "trace.txt"
    r = _child(p, "built", True, trace)
    assert r.returncode == -signal.SIGKILL
    assert (tmp_path / ".s.daisy_nb-new" / "zarr.json").exists()
    import shutil

    shutil.rmtree(p)  # the user deletes the store by hand (not Task.reset)
    with TrackingStore.open(p, *NEW) as s:  # a fresh store: no marks from the stale build
        assert not s.done.any() and not s.failures.any()
    assert not (tmp_path / ".s.daisy_nb-new").exists()


def test_reset_removes_a_leftover_build(tmp_path):
    from daisy_nb.tracking import reset

    p = tmp_path / "s"
    _make_store(p)
    r = _child(p, "built", True, tmp_path / "trace.txt")
    assert r.returncode == -signal.SIGKILL
    assert reset(p) == str(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["trace.txt"]

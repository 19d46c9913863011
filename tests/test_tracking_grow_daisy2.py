"""Stores written by daisy 2.0.0 (no layout record) on a grown volume: ``daisy-nb track migrate``.

The fixture in tests/data/tracking_grow_daisy2/ was written by the published daisy
2.0.0 (tests/golden/gen_tracking_grow_fixture.py, run with the wheel; daisy refused
the grown volume, as recorded there). These tests do not import daisy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daisy_nb.tracking import LAYOUT_ATTRIBUTE, TrackingStore

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "workers"))
from test_tracking_grow import _expected_reruns, _processed, _task, twin  # noqa: E402

FIXTURE = HERE / "data" / "tracking_grow_daisy2"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
CASES = {c["fit"]: c for c in EXPECTED["cases"]}


def _t(d):
    return tuple(d["offset"]), tuple(d["shape"])


def _cfgs(case):
    old = {
        "total_roi": _t(case["total_roi"]),
        "read_roi": _t(case["read_roi"]),
        "write_roi": _t(case["write_roi"]),
        "fit": case["fit"],
        "read_write_conflict": case["read_write_conflict"],
    }
    return old, {**old, "total_roi": _t(case["grown_total_roi"])}


def _roi_arg(d) -> str:
    return ",".join(map(str, d["offset"])) + ":" + ",".join(map(str, d["shape"]))


def _migrate(p: Path, case, *extra, from_roi=None):
    cmd = [
        sys.executable,
        "-m",
        "daisy_nb",
        "track",
        "migrate",
        str(p),
        f"--from-roi={from_roi or _roi_arg(case['total_roi'])}",
        f"--read-roi={_roi_arg(case['read_roi'])}",
        f"--write-roi={_roi_arg(case['write_roi'])}",
        f"--fit={case['fit']}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def _files(p: Path):
    return {f: f.read_bytes() for f in p.rglob("*") if f.is_file()}


def test_fixture_was_refused_by_daisy():
    for case in CASES.values():
        assert case["attributes"] == ["daisy_task_hash"]
        assert "different task layout" in case["daisy_on_grown_volume"]


@pytest.mark.parametrize("fit", sorted(CASES))
def test_daisy2_store_adopted_then_resumed_grown(tmp_path, monkeypatch, fit):
    import daisy_nb

    case = CASES[fit]
    old, new = _cfgs(case)
    p = tmp_path / case["dir"]
    shutil.copytree(FIXTURE / case["dir"], p)
    before = _files(p)
    # without a record: refused, with the way out, and left alone
    with pytest.raises(RuntimeError, match="daisy-nb track migrate"):
        TrackingStore.open(p, new["total_roi"], new["read_roi"], new["write_roi"], fit)
    assert _files(p) == before
    # ROIs that do not match the stored hash: refused, left alone
    r = _migrate(p, case, from_roi="0,0:64,47")
    assert r.returncode == 2 and "not written for these ROIs" in r.stderr, r.stderr
    assert _files(p) == before
    # the right ROIs: recognised and recorded; daisy's documents otherwise unchanged
    r = _migrate(p, case, "--conflict=yes")
    assert r.returncode == 0 and "recognised" in r.stdout, r.stderr
    meta = json.loads((p / "zarr.json").read_text())
    assert meta["attributes"]["daisy_task_hash"] == case["hash"]
    assert meta["attributes"][LAYOUT_ATTRIBUTE]["read_write_conflict"] is True
    for f, b in before.items():
        if f.name != "zarr.json" or f.parent != p:
            assert f.read_bytes() == b, f
    # resumed on the grown volume: exactly the blocks without an unchanged done twin run
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("DAISY_NB_TEST_OUT", str(out))
    monkeypatch.setenv("DAISY_NB_GROW_FAIL", "")
    done_before = {tuple(c["write_begin"]) for c in case["calls"] if c["status"] == "success"}
    assert len(done_before) == case["counts"]["completed"]
    st = daisy_nb.run_blockwise(
        [_task(case["dir"], new, p)], multiprocessing=False, progress=False, summary=False, return_states=True
    )
    ran = _processed(out, case["dir"])
    assert ran == _expected_reruns(old, new, done_before)
    assert (25, 15) in ran  # the block daisy failed runs again
    assert st[case["dir"]].failed_count == 0


@pytest.mark.parametrize("fit", sorted(CASES))
def test_migrate_to_roi_at_once(tmp_path, fit):
    case = CASES[fit]
    old, new = _cfgs(case)
    p = tmp_path / case["dir"]
    shutil.copytree(FIXTURE / case["dir"], p)
    exp_done, exp_fail = twin(
        old,
        new,
        np.asarray(case["done"], np.uint8).reshape(-1),
        np.asarray(case["failures"], np.uint32).reshape(-1),
    )
    r = _migrate(p, case, f"--to-roi={_roi_arg(case['grown_total_roi'])}")
    assert r.returncode == 0 and "migrated" in r.stdout, r.stderr
    with TrackingStore.open(p, new["total_roi"], new["read_roi"], new["write_roi"], fit) as s:
        assert s.grown_from is None  # already migrated
        np.testing.assert_array_equal(s.done.reshape(-1), exp_done)
        np.testing.assert_array_equal(s.failures.reshape(-1), exp_fail)
    # a second migrate to the same ROI is a no-op
    r = _migrate(p, case, f"--to-roi={_roi_arg(case['grown_total_roi'])}")
    assert r.returncode == 0 and "already migrated" in r.stdout, r.stderr
    # a --to-roi that is not a growth is refused
    q = tmp_path / "q"
    shutil.copytree(FIXTURE / case["dir"], q)
    r = _migrate(q, case, "--to-roi=-3,0:95,60")
    assert r.returncode == 2 and "fraction of a block" in r.stderr, r.stderr


def test_migrate_needs_a_store(tmp_path):
    case = CASES["valid"]
    r = _migrate(tmp_path / "nothing", case)
    assert r.returncode == 2 and "no block tracking" in r.stderr


def test_track_without_action(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    r = subprocess.run([sys.executable, "-m", "daisy_nb", "track"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "expected an action" in r.stderr

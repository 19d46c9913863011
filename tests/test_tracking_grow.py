"""A tracking store for a volume that grew keeps the marks of its unchanged blocks.

Real stores on disk (``daisy_nb.tracking``), checked against a slow twin that maps
marks by effective write ROI over the reference block enumeration
(``tests/reference/graph.py``): a block done before is done after iff its write ROI
(``write & total_write_roi``) is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daisy_nb.tracking import (
    LAYOUT_ATTRIBUTE,
    TrackingStore,
    _grow,
    _layout,
    grid_linear_indices,
    read_tracking,
    task_hash,
)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from reference.graph import RefGraph, roi_intersect  # noqa: E402
from strategies import graph_configs  # noqa: E402

# ---------------------------------------------------------------------------
# the twin
# ---------------------------------------------------------------------------


def _ref(cfg) -> RefGraph:
    return RefGraph(
        cfg["total_roi"], cfg["read_roi"], cfg["write_roi"], cfg.get("read_write_conflict", False), cfg["fit"]
    )


def _key(g: RefGraph, b):
    """A block's effective write and read ROIs: what it wrote, from what it read."""
    return roi_intersect(g.total_write_roi, b.write), roi_intersect(g.total_roi, b.read)


def _lin(cfg, b) -> int:
    return int(grid_linear_indices(cfg["total_roi"], cfg["write_roi"], list(b.write[0])))


def twin(old_cfg, new_cfg, old_done: np.ndarray, old_fail: np.ndarray):
    """Expected ``(done, failures)`` flat arrays of the new grid, mapping blocks by their ROIs."""
    og, ng = _ref(old_cfg), _ref(new_cfg)
    marks = {}
    for b in og.blocks():
        i = _lin(old_cfg, b)
        marks[_key(og, b)] = (old_done[i], old_fail[i])
    n = int(np.prod(_grow._Axes(_layout.layout_record(*_rois(new_cfg))).grid))
    done, fail = np.zeros(n, np.uint8), np.zeros(n, np.uint32)
    for b in ng.blocks():
        m = marks.get(_key(ng, b))
        if m is not None:
            i = _lin(new_cfg, b)
            done[i], fail[i] = m
    return done, fail


def _rois(cfg):
    return cfg["total_roi"], cfg["read_roi"], cfg["write_roi"], cfg["fit"]


def _grown(cfg, lower, upper):
    """``cfg`` with ``total_roi`` grown by ``lower`` strides below and ``upper`` units above."""
    (off, shp), ws = cfg["total_roi"], cfg["write_roi"][1]
    new_off = tuple(o - a * w for o, a, w in zip(off, lower, ws))
    new_shp = tuple(s + a * w + u for s, a, w, u in zip(shp, lower, ws, upper))
    return {**cfg, "total_roi": (new_off, new_shp)}


def _fill(path, cfg, rng, p_done=0.6, conflict=None):
    """A store for ``cfg`` with random marks on every cell (blocks and not); its arrays."""
    with TrackingStore.open(path, *_rois(cfg), read_write_conflict=conflict, durable=False) as s:
        s.done[...] = rng.random(s.grid_shape) < p_done
        s.failures[...] = rng.integers(0, 4, s.grid_shape)
        s.mark_dirty()
        return s.done.reshape(-1).copy(), s.failures.reshape(-1).copy()


def _arrays(path):
    info = read_tracking(path)
    return np.array(info["done"]).reshape(-1), np.array(info["failures"]).reshape(-1), info["task_hash"]


def _side_dirs(path: Path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


# ---------------------------------------------------------------------------
# the rule, for random grids and growths (hypothesis, against the twin)
# ---------------------------------------------------------------------------


@st.composite
def growths(draw):
    cfg = draw(graph_configs(max_ndim=3, max_blocks=120, allow_4d=False))
    nd = len(cfg["total_roi"][0])
    ws = cfg["write_roi"][1]
    lower = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    upper = tuple(draw(st.integers(0, 2 * w + 3)) for w in ws)
    return cfg, lower, upper, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(growths())
def test_grown_store_keeps_exactly_the_unchanged_blocks(case):
    cfg, lower, upper, seed = case
    new = _grown(cfg, lower, upper)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "s"
        old_done, old_fail = _fill(p, cfg, rng)
        exp_done, exp_fail = twin(cfg, new, old_done, old_fail)
        same = task_hash(*_rois(cfg)) == task_hash(*_rois(new))
        with TrackingStore.open(p, *_rois(new), durable=False) as s:
            got_done, got_fail = s.done.reshape(-1).copy(), s.failures.reshape(-1).copy()
            info = s.grown_from
        if same:  # nothing grew: the store is the same, every cell kept
            assert info is None
            np.testing.assert_array_equal(got_done, old_done)
            return
        np.testing.assert_array_equal(got_done, exp_done)
        np.testing.assert_array_equal(got_fail, exp_fail)
        assert info["kept"] == int(exp_done.sum()) and info["had"] == int(old_done.sum())
        assert info["growth"].new_blocks == len(_ref(new).blocks())
        assert info["growth"].old_blocks == len(_ref(cfg).blocks())
        info["growth"].validate()
        assert _side_dirs(p) == []
        # the migrated store is a plain store of the new layout: reopening changes nothing
        with TrackingStore.open(p, *_rois(new), durable=False) as s:
            assert s.grown_from is None
            np.testing.assert_array_equal(s.done.reshape(-1), exp_done)


# ---------------------------------------------------------------------------
# named cases: axes, fits, conflict, and the refusals
# ---------------------------------------------------------------------------


def _cfg(total, read, write, fit="valid", conflict=False):
    return {"total_roi": total, "read_roi": read, "write_roi": write, "fit": fit, "read_write_conflict": conflict}


BASE = _cfg(((0, 0), (65, 47)), ((0, 0), (20, 20)), ((5, 5), (10, 10)))  # context 5, ragged edges


@pytest.mark.parametrize("fit", ["valid", "shrink", "overhang"])
@pytest.mark.parametrize(
    "lower,upper",
    [((0, 0), (20, 0)), ((0, 0), (0, 13)), ((0, 0), (20, 13)), ((2, 0), (0, 0)), ((1, 3), (7, 2))],
    ids=["far-axis0", "far-axis1", "far-both", "negative-axis0", "all-sides"],
)
def test_named_growths(tmp_path, fit, lower, upper):
    cfg = {**BASE, "fit": fit}
    new = _grown(cfg, lower, upper)
    p = tmp_path / "s"
    rng = np.random.default_rng(7)
    old_done, old_fail = _fill(p, cfg, rng, p_done=1.0)
    exp_done, exp_fail = twin(cfg, new, old_done, old_fail)
    with TrackingStore.open(p, *_rois(new)) as s:
        np.testing.assert_array_equal(s.done.reshape(-1), exp_done)
        np.testing.assert_array_equal(s.failures.reshape(-1), exp_fail)
    og, ng = _ref(cfg), _ref(new)
    kept = int(exp_done.sum())
    # valid: every old block is whole and kept; shrink/overhang lose the old far-edge
    # blocks of the axes that grew at their far end (the ragged edges of BASE)
    if fit == "valid" or not any(upper):
        assert kept == len(og.blocks())
    else:
        assert kept < len(og.blocks())
    assert 0 < kept < len(ng.blocks())


def test_negative_growth_shifts_grid_and_ids(tmp_path):
    """Growing towards negative coordinates by whole strides shifts the grid index of every
    old block by the strides grown (and so its Cantor block id); the marks follow."""
    cfg = _cfg(((0,), (40,)), ((0,), (10,)), ((0,), (10,)))
    new = _grown(cfg, (3,), (0,))
    p = tmp_path / "s"
    with TrackingStore.open(p, *_rois(cfg)) as s:
        s.mark_done([0, 2])
        s.add_failures([1], 5)
    with TrackingStore.open(p, *_rois(new)) as s:
        assert s.grid_shape == (7,)
        assert s.done.tolist() == [0, 0, 0, 1, 0, 1, 0]
        assert s.failures.tolist() == [0, 0, 0, 0, 5, 0, 0]
        assert s.grown_from["growth"].shift == (3,)
    og, ng = _ref(cfg), _ref(new)
    old_ids = {b.write: b.spatial_id for b in og.blocks()}
    new_ids = {b.write: b.spatial_id for b in ng.blocks()}
    assert all(new_ids[w] == old_ids[w] + 3 for w in old_ids)  # 1-D: the id is the grid index


@pytest.mark.parametrize(
    "change,what",
    [
        (lambda c: {**c, "write_roi": ((5, 5), (10, 5)), "read_roi": ((0, 0), (20, 15))}, "write shape"),
        (lambda c: {**c, "read_roi": ((0, 0), (22, 20))}, "context"),
        (lambda c: {**c, "fit": "shrink"}, "fit changed"),
        (lambda c: _grown(c, (0, 0), (0, 0)) | {"total_roi": ((-5, 0), (70, 47))}, "fraction of a block"),
        (lambda c: {**c, "total_roi": ((0, 0), (55, 47))}, "shrank"),
        (lambda c: {**c, "total_roi": ((10, 0), (65, 47))}, "shrank or moved"),
    ],
    ids=["stride", "context", "fit", "origin", "shrunk", "moved"],
)
def test_real_layout_changes_are_refused(tmp_path, change, what):
    p = tmp_path / "s"
    _fill(p, BASE, np.random.default_rng(1))
    before = {f: f.read_bytes() for f in p.rglob("*") if f.is_file()}
    new = change(BASE)
    with pytest.raises(RuntimeError) as ei:
        TrackingStore.open(p, *_rois(new))
    msg = str(ei.value)
    assert "different task layout" in msg and what in msg
    assert "Task.reset()" in msg and "tracking_path" in msg and f"rm -rf {p}" in msg
    assert {f: f.read_bytes() for f in p.rglob("*") if f.is_file()} == before


def test_conflict_flag_is_recorded_not_compared(tmp_path):
    p = tmp_path / "s"
    cfg = {**BASE, "fit": "shrink"}
    TrackingStore.open(p, *_rois(cfg), read_write_conflict=True).close()
    rec = json.loads((p / "zarr.json").read_text())["attributes"][LAYOUT_ATTRIBUTE]
    assert rec["read_write_conflict"] is True and rec["grid_origin"] == [5, 5] and rec["write_stride"] == [10, 10]
    assert rec["context"] == {"lower": [5, 5], "upper": [5, 5]}
    with TrackingStore.open(p, *_rois(_grown(cfg, (0, 0), (10, 0))), read_write_conflict=False) as s:
        assert s.grown_from is not None
    rec = json.loads((p / "zarr.json").read_text())["attributes"][LAYOUT_ATTRIBUTE]
    assert rec["read_write_conflict"] is False and rec["total_roi"]["shape"] == [75, 47]


def test_store_without_record_is_refused_with_the_migrate_hint(tmp_path):
    p = tmp_path / "s"
    TrackingStore.open(p, *_rois(BASE)).close()
    meta = json.loads((p / "zarr.json").read_text())
    del meta["attributes"][LAYOUT_ATTRIBUTE]  # as daisy 2.0.0 writes it
    (p / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="daisy-nb track migrate"):
        TrackingStore.open(p, *_rois(_grown(BASE, (0, 0), (10, 0))))


def test_large_grid_is_remapped_in_pieces(tmp_path, monkeypatch):
    """Pieces smaller than a row of the grid (the split moves to a later axis)."""
    monkeypatch.setattr(_grow, "PIECE_CELLS", 7)
    cfg = _cfg(((0, 0, 0), (50, 60, 70)), ((0, 0, 0), (10, 10, 10)), ((0, 0, 0), (10, 10, 10)), "shrink")
    new = _grown(cfg, (1, 0, 2), (13, 10, 5))
    p = tmp_path / "s"
    old_done, old_fail = _fill(p, cfg, np.random.default_rng(3))
    exp_done, exp_fail = twin(cfg, new, old_done, old_fail)
    with TrackingStore.open(p, *_rois(new)) as s:
        np.testing.assert_array_equal(s.done.reshape(-1), exp_done)
        np.testing.assert_array_equal(s.failures.reshape(-1), exp_fail)


# ---------------------------------------------------------------------------
# runs: which blocks run again
# ---------------------------------------------------------------------------


def _processed(out: Path, task: str) -> set[tuple[int, ...]]:
    return {tuple(int(v) for v in f.name[len(task) + 1 :].split(",")) for f in out.glob(f"{task}_*")}


def _task(tid, cfg, path, max_retries=0):
    import growfns
    from funlib.geometry import Roi

    import daisy_nb

    return daisy_nb.Task(
        tid,
        Roi(*cfg["total_roi"]),
        Roi(*cfg["read_roi"]),
        Roi(*cfg["write_roi"]),
        process_function=growfns.record,
        read_write_conflict=cfg["read_write_conflict"],
        fit=cfg["fit"],
        max_retries=max_retries,
        tracking_path=str(path),
        max_workers=2,
    )


def _expected_reruns(cfg, new, done_before: set[tuple[int, ...]]):
    """Write begins of the grown task's blocks that run again: those without an unchanged done twin."""
    og, ng = _ref(cfg), _ref(new)
    kept = {_key(og, b) for b in og.blocks() if b.write[0] in done_before}
    return {b.write[0] for b in ng.blocks() if _key(ng, b) not in kept}


@pytest.mark.parametrize("fit", ["valid", "shrink", "overhang"])
@pytest.mark.parametrize("conflict", [False, True], ids=["noconflict", "conflict"])
def test_serial_resume_on_grown_volume(tmp_path, monkeypatch, fit, conflict):
    import daisy_nb

    sys.path.insert(0, str(HERE / "workers"))
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("DAISY_NB_TEST_OUT", str(out))
    cfg = {**BASE, "fit": fit, "read_write_conflict": conflict}
    new = _grown(cfg, (1, 0), (20, 13))
    monkeypatch.setenv("DAISY_NB_GROW_FAIL", "15,15")
    daisy_nb.run_blockwise([_task("t", cfg, tmp_path / "track")], multiprocessing=False, progress=False, summary=False)
    first = _processed(out, "t")
    done_before = first - {(15, 15)}  # with conflict, its later-level neighbours never ran
    for f in out.iterdir():
        f.unlink()
    monkeypatch.setenv("DAISY_NB_GROW_FAIL", "")
    daisy_nb.run_blockwise([_task("t", new, tmp_path / "track")], multiprocessing=False, progress=False, summary=False)
    assert _processed(out, "t") == _expected_reruns(cfg, new, done_before)


@pytest.mark.mp
@pytest.mark.timeout(180)
def test_pool_pipeline_downstream_grows_with_it(tmp_path, monkeypatch, no_leaks):
    """A real pool run (worker processes) of a two-task pipeline, resumed on the grown volume."""
    import daisy_nb

    sys.path.insert(0, str(HERE / "workers"))
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("DAISY_NB_TEST_OUT", str(out))
    a_cfg = {**BASE, "fit": "shrink", "read_write_conflict": False}
    b_cfg = {**BASE, "fit": "shrink", "read_write_conflict": True}
    grow = ((1, 0), (20, 13))
    monkeypatch.setenv("DAISY_NB_GROW_FAIL", "25,5")  # fails in a: b's blocks reading it are orphaned

    def run(ac, bc):
        a = _task("a", ac, tmp_path / "ta")
        b = _task("b", bc, tmp_path / "tb")
        return daisy_nb.run_blockwise(a + b, progress=False, summary=False, return_states=True)

    st1 = run(a_cfg, b_cfg)
    assert st1["a"].failed_count == 1 and st1["b"].orphaned_count > 0
    first = {t: _processed(out, t) for t in ("a", "b")}
    done_a = first["a"] - {(25, 5)}
    done_b = first["b"]
    for f in out.iterdir():
        f.unlink()
    monkeypatch.setenv("DAISY_NB_GROW_FAIL", "")
    a_new, b_new = _grown(a_cfg, *grow), _grown(b_cfg, *grow)
    st2 = run(a_new, b_new)
    assert st2["a"].failed_count == 0 and st2["b"].failed_count == 0
    exp_a = _expected_reruns(a_cfg, a_new, done_a)
    exp_b = _expected_reruns(b_cfg, b_new, done_b)
    assert _processed(out, "a") == exp_a
    assert _processed(out, "b") == exp_b
    assert st2["a"].skipped_count == len(_ref(a_new).blocks()) - len(exp_a)
    assert st2["b"].skipped_count == len(_ref(b_new).blocks()) - len(exp_b)


# ---------------------------------------------------------------------------
# the dry run and status show what a resume would skip
# ---------------------------------------------------------------------------


def test_dry_run_and_status_show_the_grown_resume(tmp_path):
    from funlib.geometry import Roi

    import daisy_nb
    from daisy_nb.status import format_status, task_status

    cfg = {**BASE, "fit": "shrink"}
    new = _grown(cfg, (1, 0), (20, 13))
    p = tmp_path / "s"
    old_done, old_fail = _fill(p, cfg, np.random.default_rng(5))
    exp_done, _ = twin(cfg, new, old_done, old_fail)
    before = {f: f.read_bytes() for f in p.rglob("*") if f.is_file()}
    task = daisy_nb.Task(
        "s",
        Roi(*new["total_roi"]),
        Roi(*new["read_roi"]),
        Roi(*new["write_roi"]),
        process_function=lambda b: None,
        fit="shrink",
        read_write_conflict=False,
        tracking_path=str(p),
    )
    plan = daisy_nb.run_blockwise([task], dry_run=True)
    tp = plan.tasks[0]
    assert tp.done_by_tracking == int(exp_done.sum()) and not plan.problems
    assert tp.to_run == len(_ref(new).blocks()) - int(exp_done.sum())
    assert tp.tracking_note.startswith("grown volume")
    st = task_status(task)
    assert st["done"] == int(exp_done.sum()) and st["grown_from"]["shift"] == [1, 0]
    assert "grown volume" in format_status(st)
    # only read: the store is as it was
    assert {f: f.read_bytes() for f in p.rglob("*") if f.is_file()} == before
    # and the resume does what they said
    with TrackingStore.open(p, *_rois(new)) as s:
        np.testing.assert_array_equal(s.done.reshape(-1), exp_done)


def test_status_cli_grown_and_refused(tmp_path):
    cfg = {**BASE, "fit": "shrink"}
    p = tmp_path / "s"
    _fill(p, cfg, np.random.default_rng(2), p_done=1.0)
    base = [sys.executable, "-m", "daisy_nb", "status", str(p), "--read-roi=0,0:20,20", "--write-roi=5,5:10,10"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    r = subprocess.run([*base, "--total-roi=-10,0:85,60", "--fit=shrink"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "grown volume" in r.stdout, r.stderr
    r = subprocess.run([*base, "--total-roi=-7,0:85,60", "--fit=shrink"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "fraction of a block" in r.stderr


@pytest.mark.parametrize("seed", range(6))
def test_sparse_piece_writes(tmp_path, seed):
    """Pieces are written page by page, all-zero pages left as holes, at any offset."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40_000))
    vals = np.zeros(n, np.uint32)
    vals[rng.integers(0, n, int(rng.integers(0, 12)))] = rng.integers(1, 9)
    offset = int(rng.integers(0, 3 * 4096)) * 4
    f = tmp_path / "chunk"
    fd = os.open(f, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, offset + vals.nbytes + 4096)
        _grow._pwrite_sparse(fd, vals, offset)
    finally:
        os.close(fd)
    raw = np.fromfile(f, np.uint8)
    np.testing.assert_array_equal(raw[offset : offset + vals.nbytes].view(np.uint32), vals)
    assert not raw[:offset].any() and not raw[offset + vals.nbytes :].any()
    pages_touched = {(offset + 4 * int(i)) // 4096 for i in np.flatnonzero(vals)}
    assert os.stat(f).st_blocks * 512 <= (len(pages_touched) + 2) * 4096 + 8192


def test_growth_validate_catches_a_broken_mapping():
    old = _layout.layout_record(*_rois({**BASE, "fit": "shrink"}))
    new = _layout.layout_record(*_rois(_grown({**BASE, "fit": "shrink"}, (1, 0), (20, 13))))
    g = _grow.compare(old, new)
    assert isinstance(g, _grow.Growth)
    g.validate()
    import dataclasses

    for broken in (
        dataclasses.replace(g, shift=(-1, 0)),
        dataclasses.replace(g, shift=(9, 0)),
        dataclasses.replace(g, keep=[np.ones(g.old_grid[0], bool), np.ones(g.old_grid[1], bool)]),
        dataclasses.replace(g, keep=g.keep[:1]),
    ):
        with pytest.raises(AssertionError):
            broken.validate()

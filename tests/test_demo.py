"""The demo pipeline (``python -m daisy_nb demo``) at small sizes: correct, resumable, with a CLI."""

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

scipy = pytest.importorskip("scipy")
zarr = pytest.importorskip("zarr")

from scipy import ndimage  # noqa: E402

import daisy_nb  # noqa: E402

_DEMO_PREIMPORTED = "daisy_nb.demo" in sys.modules
from daisy_nb import demo  # noqa: E402

QUIET = {"progress": False, "summary": False, "verbose": False}


@pytest.fixture(scope="module", autouse=True)
def _unimport_demo():
    """Leave daisy_nb as found: later tests may simulate a missing demo module via sys.modules,
    which ``from . import demo`` ignores once ``daisy_nb.demo`` is a package attribute."""
    yield
    if not _DEMO_PREIMPORTED:
        sys.modules.pop("daisy_nb.demo", None)
        vars(daisy_nb).pop("demo", None)


def _whole_volume_reference(out: Path, size):
    """Independent of demo.check_result: recompute from raw with scipy and return (mask, labels)."""
    p = json.loads((out / "demo.json").read_text())
    root = zarr.open_group(str(out / "volume.zarr"), mode="r")
    raw = root["raw"][...]
    r = p["radius"]
    assert raw.shape == tuple(s + 2 * r for s in size)
    sm = ndimage.gaussian_filter(raw, p["sigma"], truncate=p["truncate"])[tuple(slice(r, r + s) for s in size)]
    np.testing.assert_array_equal(root["smoothed"][...], sm)
    mask = sm > p["threshold"]
    labels, n = ndimage.label(mask)
    return mask, labels, n


def _assert_labels_match(out: Path, size):
    mask, ref, n = _whole_volume_reference(out, size)
    got = zarr.open_array(str(out / "volume.zarr" / "labels"), mode="r")[...]
    assert got.shape == tuple(size)
    np.testing.assert_array_equal(got != 0, mask)
    # bijection between label values on the foreground
    pairs = {(int(a), int(b)) for a, b in zip(got[mask].tolist(), ref[mask].tolist())}
    assert len(pairs) == n == len(np.unique(got[mask]))
    assert n > 3  # the volume has several objects
    return n


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_demo_multiprocessing_matches_whole_volume(tmp_path):
    out = tmp_path / "demo"
    res = demo.run_demo(out, size=64, block=16, workers=2, multiprocessing=True, **QUIET)
    assert res["complete"] and not res["interrupted"]
    assert res["agrees"] is True
    assert set(res["states"]) == set(demo.TASKS)
    for tid, c in res["counts"].items():
        assert c["completed"] == c["total"] > 0, tid
        assert c["skipped"] == c["failed"] == c["orphaned"] == 0, tid
    assert res["counts"]["label"]["total"] == 64 and res["counts"]["resolve"]["total"] == 1
    checks = res["checks"]
    assert checks["smoothed"]["equal"] and checks["mask"]["equal"] and checks["labels"]["equal_up_to_permutation"]
    # objects cut by block boundaries had to be merged, so the merge step was exercised
    assert checks["labels"]["objects_spanning_blocks"] > 0
    assert checks["labels"]["fragments"] > checks["labels"]["components"]
    n = _assert_labels_match(out, (64, 64, 64))
    assert n == checks["labels"]["components"]
    # every array is chunked like the blocks: one block writes one chunk
    for name in ("raw", "smoothed", "mask", "fragments", "labels"):
        assert zarr.open_array(str(out / "volume.zarr" / name), mode="r").chunks == (16, 16, 16)
    for k in ("pipeline", "check", "total"):
        assert res["timings"][k] >= 0


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_demo_resume_skips_finished_blocks(tmp_path):
    out = tmp_path / "demo"
    first = demo.run_demo(
        out, size=48, block=16, workers=2, multiprocessing=True, fail_fraction=0.3, fail_task="label", **QUIET
    )
    assert not first["complete"] and first["agrees"] is False and first["checks"] is None
    c1 = first["counts"]
    for tid in ("generate", "smooth", "threshold"):
        assert c1[tid]["completed"] == c1[tid]["total"], tid
    assert c1["label"]["failed"] > 0 and 0 < c1["label"]["completed"] < c1["label"]["total"]
    assert c1["resolve"]["completed"] == 0 and c1["relabel"]["completed"] == 0
    assert not first["states"]["label"].abandoned  # injected failures fail blocks, not the task
    assert c1["label"]["completed"] + c1["label"]["failed"] + c1["label"]["orphaned"] == c1["label"]["total"]

    second = demo.run_demo(out, workers=2, resume=True, multiprocessing=True, **QUIET)
    assert second["resumed"] and second["complete"]
    assert second["agrees"] is True
    c2 = second["counts"]
    for tid in demo.TASKS:
        # block tracking: exactly the blocks finished in the first run are skipped now
        assert c2[tid]["skipped"] == c1[tid]["completed"], tid
        assert c2[tid]["completed"] == c2[tid]["total"], tid
        assert c2[tid]["failed"] == c2[tid]["orphaned"] == 0, tid
    assert second["states"]["generate"].skipped_count == second["states"]["generate"].total_block_count
    _assert_labels_match(out, (48, 48, 48))


def test_demo_serial_uneven_shapes(tmp_path):
    """Sizes that are not multiples of the block (fit="shrink"), anisotropic blocks, in-process."""
    out = tmp_path / "demo"
    res = demo.run_demo(out, size=(40, 35, 29), block=(16, 12, 16), multiprocessing=False, seed=3, **QUIET)
    assert res["complete"] and res["agrees"] is True
    _assert_labels_match(out, (40, 35, 29))


def _graph(task):
    import daisy_nb

    return daisy_nb.BlockwiseDependencyGraph(
        task.task_id, task.read_roi, task.write_roi, task.read_write_conflict, task.fit, total_read_roi=task.total_roi
    )


def _grid_key(block, B):
    return tuple(int(v) // b for v, b in zip(block.write_roi.begin, B))


@pytest.mark.parametrize(
    "size,block",
    [
        ((48,) * 3, (16,) * 3),
        ((80,) * 3, (16,) * 3),
        ((40, 35, 29), (16, 12, 16)),
        ((96, 80, 112), (16, 16, 16)),
        ((demo.DEFAULT_SIZE,) * 3, (demo.DEFAULT_BLOCK,) * 3),
    ],
)
def test_label_conflict_levels_order_every_face_adjacent_pair(tmp_path, size, block):
    """What the connected-components merge relies on: for two face-adjacent label blocks, one is a
    (transitive) upstream of the other, so they never run at the same time and the later one sees
    the earlier one's fragments in its one-voxel context."""
    import sys

    p = demo._params(tmp_path, size, block, 1)
    _, tasks = demo.build_pipeline(p)
    label = tasks[demo.TASKS.index("label")]
    assert label.read_write_conflict
    g = _graph(label)
    blocks = list(g.blocks())
    keys = {_grid_key(b, block) for b in blocks}
    assert len(keys) == len(blocks) == int(np.prod(p["grid"]))
    up = {_grid_key(b, block): {_grid_key(u, block) for u in g.upstream(b)} for b in blocks}
    anc = {}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(blocks) + 100))

    def ancestors(k):
        if k not in anc:
            anc[k] = set().union(*({u} | ancestors(u) for u in up[k])) if up[k] else set()
        return anc[k]

    pairs = 0
    for k in keys:
        for d in range(3):
            n = tuple(v + (i == d) for i, v in enumerate(k))
            if n in keys:
                pairs += 1
                assert n in ancestors(k) or k in ancestors(n), (k, n)
    assert pairs > 0


def test_block_writes_are_chunk_aligned(tmp_path):
    """Every block of every task writes inside exactly one chunk of its output array."""
    size, block = (40, 35, 29), (16, 12, 16)
    p = demo._params(tmp_path, size, block, 1)
    _, tasks = demo.build_pipeline(p)
    origin = {"generate": p["raw_offset"]}
    for t in tasks:
        if t.task_id == "resolve":
            continue
        o = origin.get(t.task_id, (0, 0, 0))
        written = set()
        for b in _graph(t).blocks():
            wb = [int(v) - oo for v, oo in zip(b.write_roi.begin, o)]
            we = [int(v) - oo for v, oo in zip(b.write_roi.end, o)]
            chunk = tuple(v // c for v, c in zip(wb, block))
            assert all(v % c == 0 for v, c in zip(wb, block)), (t.task_id, b.write_roi)
            assert all(e - v <= c for v, e, c in zip(wb, we, block)), (t.task_id, b.write_roi)
            assert chunk not in written, (t.task_id, chunk)
            written.add(chunk)
        shape = p["raw_shape"] if t.task_id == "generate" else size
        assert len(written) == int(np.prod([-(-s // c) for s, c in zip(shape, block)])), t.task_id


def test_same_partition():
    a = np.array([[0, 1, 1, 2], [0, 3, 3, 2]])
    ok, info = demo.same_partition(a, np.where(a > 0, 10 - a, 0))
    assert ok and info["labels"] == 3
    assert not demo.same_partition(a, np.where(a == 3, 1, a))[0]  # merged
    assert not demo.same_partition(np.where(a == 3, 1, a), a)[0]  # split
    assert not demo.same_partition(a, np.where(a == 2, 0, a))[0]  # background differs


_label_volumes = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        hnp.arrays(np.int64, n, elements=st.integers(0, 5)),
        st.sampled_from([np.uint8, np.uint32, np.int32, np.int64, np.uint64]),
        st.sampled_from(["permuted", "merged", "split", "background", "independent", "huge"]),
        hnp.arrays(np.int64, n, elements=st.integers(0, 5)),
        st.randoms(use_true_random=False),
    )
)


@given(_label_volumes)
@settings(max_examples=400, deadline=None)
def test_same_partition_agrees_with_the_sorted_count(case):
    """The linear-time answer (and its info) is the sort-based twin's, for relabellings that are
    bijections and for every way one can fail (merged, split, background, unrelated, ids too
    large for a table)."""
    a, dtype, how, other, rnd = case
    perm = list(range(1, 7))
    rnd.shuffle(perm)
    b = np.where(a > 0, np.take([0, *perm], a), 0)
    if how == "merged" and a.max() > 1:
        b = np.where(a == a.max(), np.take([0, *perm], 1), b)
    elif how == "split":
        b = np.where((a > 0) & (np.arange(a.size) % 2 == 1), 7, b)
    elif how == "background":
        b = np.where(np.arange(a.size) == rnd.randrange(a.size), 0, b)
    elif how == "independent":
        b = other
    elif how == "huge":
        b = np.where(b > 0, b + 10**9, 0)
    if how == "huge":
        dtype = np.int64  # ids past a table's size: the sorted count answers
    a, b = a.astype(dtype), b.astype(dtype)
    assert demo.same_partition(a, b) == demo.same_partition_sorted(a, b)
    assert demo.same_partition(b, a) == demo.same_partition_sorted(b, a)
    with ThreadPoolExecutor(1) as pool:  # checked in two halves, one in another thread
        assert demo.same_partition(a, b, pool) == demo.same_partition_sorted(a, b)
        assert demo.same_partition(b, a, pool) == demo.same_partition_sorted(b, a)
    if how == "permuted":
        assert demo.same_partition(a, b)[0]


def test_same_partition_in_halves_compares_the_halves():
    """A label split, or two merged, across the halves is consistent within each half: the
    halves' tables disagree."""
    with ThreadPoolExecutor(1) as pool:
        one, two = np.array([1, 1, 1, 1]), np.array([1, 1, 2, 2])
        assert not demo.same_partition(one, two, pool)[0]
        assert not demo.same_partition(two, one, pool)[0]
        ok, info = demo.same_partition(np.array([[1, 2], [2, 1]]), np.array([[5, 3], [3, 5]]), pool)
        assert ok and info["labels"] == 2
    # label 1 held by the second and third parts only, mapped differently in each
    tables = [(np.array([0, 0, 7]), np.array([0, 0, 1], bool)), (np.array([0, 4, 7]), np.array([0, 1, 1], bool))]
    assert demo.check._merged(tables) is not None
    assert demo.check._merged([*tables, (np.array([0, 5, 0]), np.array([0, 1, 0], bool))]) is None


@given(
    hnp.arrays(
        st.sampled_from([np.float32, np.float64]),
        hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=12),
        elements=st.floats(-100, 100, width=32),
    ),
    st.sampled_from([0.7, 1.5, 2.0]),
    st.sampled_from([2.0, 4.0]),
)
@settings(max_examples=60, deadline=None)
def test_gaussian_filter_lines_is_scipys_bit_for_bit(x, sigma, truncate):
    """The check's filter, each pass's lines shared by two threads, is scipy's whole-volume one."""
    with ThreadPoolExecutor(1) as pool:
        got = demo.check.gaussian_filter_lines(x, sigma, truncate, pool)
    want = ndimage.gaussian_filter(x, sigma, truncate=truncate)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_same_partition_negative_ids_take_the_sorted_count():
    a = np.array([0, -3, -3, 2])
    assert demo.same_partition(a, np.array([0, 5, 5, 1])) == demo.same_partition_sorted(a, np.array([0, 5, 5, 1]))
    assert demo.same_partition(a, np.array([0, 5, 5, 1]))[0]


def _args(**kw):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    argv = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return parser.parse_args(argv)


def test_cli_errors(tmp_path, capsys):
    # nothing to resume
    assert demo.main(_args(out=tmp_path / "none", resume=True)) == 2
    # never wipes a directory it did not create
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep")
    assert demo.main(_args(out=other, size=32, block=16)) == 2
    assert (other / "precious.txt").read_text() == "keep"
    assert "refusing" in capsys.readouterr().err
    args = _args()
    assert args.size is None and args.block is None and args.workers == 2 and args.out == demo.DEFAULT_OUT


def test_cli_serial_run_and_json(tmp_path):
    out = tmp_path / "demo"
    js = tmp_path / "result.json"
    rc = demo.main(_args(out=out, size=32, block=16, serial=True, json=js))
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["agrees"] is True and doc["counts"]["relabel"]["completed"] == 8
    # resume of a finished run: everything is skipped, still agrees
    assert demo.main(_args(out=out, resume=True, serial=True, json=js)) == 0
    doc = json.loads(js.read_text())
    assert all(c["skipped"] == c["total"] for c in doc["counts"].values())
    # a size that differs from the run being resumed is refused
    assert demo.main(_args(out=out, resume=True, size=48)) == 2


def test_module_entry_point_help():
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb.demo", "--help"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    for opt in ("--size", "--block", "--workers", "--out", "--resume", "--fail-fraction"):
        assert opt in r.stdout


@pytest.mark.mp
@pytest.mark.timeout(180)
def test_cli_dashboard_and_report(tmp_path):
    out, rep = tmp_path / "demo", tmp_path / "demo.html"
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "demo", "--dashboard", "--size", "32", "--block", "16", "--out", str(out),
         "--report", str(rep), "--no-check"],
        cwd=tmp_path, capture_output=True, text=True, timeout=170, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "daisy_nb dashboard: http://127.0.0.1:" in r.stdout
    assert "/?token=" in r.stdout.split("daisy_nb dashboard: ", 1)[1].splitlines()[0]  # the URL carries the token
    html = rep.read_text()
    data = json.loads(html.split("window.DAISY_NB_REPORT = ", 1)[1].split(";</script>", 1)[0])
    tasks = {t["task_id"]: t for t in data["/api/state"]["tasks"]}
    assert tasks["relabel"]["completed"] == 8 and set(tasks) == set(demo.TASKS)
    assert sum(r["blocks"] for r in data["/api/timeline"]["rows"]) == sum(t["total"] for t in tasks.values())
    bad = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "demo", "--dashboard", "x"], cwd=tmp_path, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--dashboard" in bad.stderr

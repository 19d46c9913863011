"""The demo's check: the whole volume recomputed at once with scipy/numpy, and compared.

:func:`check_result` reads ``raw`` whole, smooths it with the whole-volume Gaussian filter,
thresholds it and labels it with ``scipy.ndimage.label``, and compares each with the blockwise
output (labels up to a permutation, :func:`same_partition`). Why the two agree bit for bit is
in the package docstring, :mod:`daisy_nb.demo`.

The check uses both cores. The Gaussian filter is separable: scipy's ``gaussian_filter`` runs
one 1-D filter per axis, each over whole lines of the volume. :func:`gaussian_filter_lines`
runs those same passes with each pass's lines shared between two threads (scipy's filters
release the GIL); a line is never cut, so every voxel is computed as in ``gaussian_filter``,
bit for bit. The blockwise outputs it is compared with are read meanwhile, one array ahead:
at most one of them waits in memory beside the reference.
"""

from __future__ import annotations

import os

import numpy as np

from .blocks import _open

__all__ = ["check_result", "gaussian_filter_lines", "same_partition", "same_partition_sorted"]


def gaussian_filter_lines(x: np.ndarray, sigma: float, truncate: float, pool=None) -> np.ndarray:
    """``scipy.ndimage.gaussian_filter(x, sigma, truncate=truncate)`` (scalar ``sigma``, default
    mode), with each axis's pass split between the calling thread and ``pool`` (an executor):
    the lines along the filtered axis are divided by another axis, so none is cut."""
    from scipy import ndimage

    if sigma <= 1e-15 or x.ndim < 2 or pool is None:
        return ndimage.gaussian_filter(x, sigma, truncate=truncate)
    out = np.empty_like(x)
    src = x
    for axis in range(x.ndim):
        split = max((k for k in range(x.ndim) if k != axis), key=lambda k: x.shape[k])
        h = x.shape[split] // 2
        halves = [
            tuple(slice(a, b) if k == split else slice(None) for k in range(x.ndim)) for a, b in ((0, h), (h, None))
        ]

        def one(s, src=src, axis=axis):
            ndimage.gaussian_filter1d(src[s], sigma, axis=axis, output=out[s], truncate=truncate)

        _in_parts(pool, one, [(s,) for s in halves])
        src = out  # scipy's own passes after the first run in place too
    return out


def same_partition(a: np.ndarray, b: np.ndarray, pool=None) -> tuple[bool, dict]:
    """True iff two label volumes are equal up to a bijective relabelling (0 = background in both).

    The answer and ``info`` are :func:`same_partition_sorted`'s. When both volumes hold small
    non-negative ids (a label image's ``1..N``), agreement is confirmed in linear time: a table
    indexed by the ids of ``a`` maps each to the id of ``b`` at its last voxel; every voxel
    agrees with it iff each label of ``a`` meets exactly one label of ``b``, and the same the
    other way round: that is a bijection. Anything else (a disagreement, large or negative
    ids) is answered by the sort-based count.

    ``pool`` (an executor): the volumes are split in two halves, one checked in the pool and
    one in the calling thread; the halves' tables then agree on every label both halves hold."""
    if a.shape != b.shape:
        return same_partition_sorted(a, b)
    fa, fb = a.reshape(-1), b.reshape(-1)
    h = fa.size // 2 if pool is not None else fa.size
    halves = [(fa[:h], fb[:h]), (fa[h:], fb[h:])] if 0 < h < fa.size else [(fa, fb)]
    fg = _in_parts(pool, _foreground, halves)  # per half: the foreground labels, or None
    if any(f is None for f in fg):
        return same_partition_sorted(a, b)
    la, lb = [f[0] for f in fg], [f[1] for f in fg]
    del fg
    size = sum(x.size for x in la)
    if size == 0 or not (_small_ids(la, size) and _small_ids(lb, size)):
        return same_partition_sorted(a, b)
    na, nb = max(int(x.max()) for x in la if x.size) + 1, max(int(x.max()) for x in lb if x.size) + 1
    tables = _in_parts(pool, lambda x, y: (_table(x, y, na), _table(y, x, nb)), list(zip(la, lb)))
    del la, lb
    if any(ab is None or ba is None for ab, ba in tables):
        return same_partition_sorted(a, b)
    ab, ba = _merged([t[0] for t in tables]), _merged([t[1] for t in tables])
    if ab is None or ba is None:
        return same_partition_sorted(a, b)
    n = int(np.count_nonzero(ab[1]))
    return True, {"background_equal": True, "labels": n, "reference_labels": n, "label_pairs": n}


def _in_parts(pool, fn, args: list) -> list:
    """``[fn(*x) for x in args]``, the first ``len(args) - 1`` in ``pool`` (if any)."""
    if pool is None or len(args) < 2:
        return [fn(*x) for x in args]
    futures = [pool.submit(fn, *x) for x in args[:-1]]
    last = fn(*args[-1])
    return [f.result() for f in futures] + [last]


def _foreground(a: np.ndarray, b: np.ndarray):
    """The labels of ``a`` and ``b`` on their foreground, in voxel order; None if the two
    foregrounds differ."""
    fa = a != 0
    if not np.array_equal(fa, b != 0):
        return None
    return a[fa], b[fa]


def _table(la: np.ndarray, lb: np.ndarray, n: int):
    """``(table, seen)``: per id of ``la`` (below ``n``), the id of ``lb`` at its last voxel, and
    which ids occur; None if a voxel of one id of ``la`` has another id in ``lb``."""
    la, lb = _index(la), _index(lb)
    table = np.zeros(n, dtype=np.intp)
    table[la] = lb  # the last voxel of each label wins; the check is that no other disagrees
    if not np.array_equal(table[la], lb):
        return None
    seen = np.zeros(n, dtype=bool)
    seen[la] = True
    return table, seen


def _index(ids: np.ndarray) -> np.ndarray:
    """``ids`` as table indices: unchanged where numpy indexes with them as they are (a copy in
    ``intp`` would double a large volume's foreground), converted where it cannot (``uint64``)."""
    return ids if np.can_cast(ids.dtype, np.intp) else ids.astype(np.intp)


def _merged(parts: list):
    """The parts' ``(table, seen)`` merged into one; None if two parts map an id they both hold
    to different ids."""
    table, seen = parts[0][0].copy(), parts[0][1].copy()
    for t, s in parts[1:]:
        both = seen & s
        if not np.array_equal(table[both], t[both]):
            return None
        table[s], seen = t[s], seen | s
    return table, seen


def _small_ids(parts: list, size: int) -> bool:
    """Integer ids, none negative, the largest at most 4 per voxel (a table of them is cheap)."""
    parts = [x for x in parts if x.size]
    if parts[0].dtype.kind not in "iu" or (parts[0].dtype.kind == "i" and min(int(x.min()) for x in parts) < 0):
        return False
    return max(int(x.max()) for x in parts) <= 4 * size + 1024


def same_partition_sorted(a: np.ndarray, b: np.ndarray) -> tuple[bool, dict]:
    """:func:`same_partition` by counting distinct labels and distinct pairs (sorts: O(n log n))."""
    fa, fb = a != 0, b != 0
    info = {"background_equal": bool(np.array_equal(fa, fb))}
    if not info["background_equal"]:
        info["background_mismatches"] = int(np.count_nonzero(fa != fb))
        return False, info
    la = a[fa].astype(np.uint64)
    lb = b[fb].astype(np.uint64)
    na = int(np.unique(la).size)
    nb = int(np.unique(lb).size)
    key = la * np.uint64(int(lb.max()) + 1 if lb.size else 1) + lb if la.size else la
    npairs = int(np.unique(key).size)
    info.update({"labels": na, "reference_labels": nb, "label_pairs": npairs})
    return na == nb == npairs, info


def check_result(p: dict) -> dict:
    """Recompute the whole volume at once with scipy/numpy and compare with the blockwise output
    (the module docstring). Returns per output what was compared, and ``agrees``."""
    from concurrent.futures import ThreadPoolExecutor

    from scipy import ndimage

    r = p["radius"]
    with ThreadPoolExecutor(2, thread_name_prefix="demo-check") as pool:
        sm_f = pool.submit(lambda: _open(p, "smoothed")[...])
        raw = _open(p, "raw")[...]
        ref_sm = gaussian_filter_lines(raw, p["sigma"], p["truncate"], pool)
        del raw
        ref_sm = ref_sm[tuple(slice(r, r + s) for s in p["size"])]  # the outputs' region, a view
        mask_f = pool.submit(lambda: _open(p, "mask")[...].astype(bool))
        sm = sm_f.result()
        del sm_f  # a finished future holds its result: the array is freed with its name
        equal = bool(np.array_equal(sm, ref_sm))
        smooth = {"equal": equal, "max_abs_diff": 0.0 if equal else float(np.max(np.abs(sm - ref_sm)))}
        del sm
        ref_mask = ref_sm > p["threshold"]
        del ref_sm
        mask = mask_f.result()
        del mask_f
        labels_f = pool.submit(lambda: _open(p, "labels")[...])
        masks = {
            "equal": bool(np.array_equal(mask, ref_mask)),
            "mismatches": int(np.count_nonzero(mask != ref_mask)),
            "foreground_fraction": float(ref_mask.mean()),
        }
        del mask
        ref_labels, nref = ndimage.label(ref_mask)
        del ref_mask
        labels = labels_f.result()
        del labels_f
        ok, info = same_partition(labels, ref_labels, pool)
    info["equal_up_to_permutation"] = ok
    info["components"] = int(nref)
    # how much merging the blockwise step had to do (the same pipeline written for another
    # library, benchmarks/bench_main_job.py, has no merge table)
    if os.path.exists(p["table_labels"]):
        final = np.load(p["table_labels"])
        sizes = np.bincount(final.astype(np.int64))[1:]
        info["fragments"] = int(final.size)
        info["objects_spanning_blocks"] = int(np.count_nonzero(sizes > 1))
    return {"smoothed": smooth, "mask": masks, "labels": info, "agrees": smooth["equal"] and masks["equal"] and ok}

"""The demo's block functions (what runs in the worker processes) and their helpers.

Each block function takes the demo's parameter dict ``p`` (paths and numbers,
bound with ``functools.partial``) and a block, opens the zarr arrays itself by
path, and writes exactly its block's chunk. The reasoning behind each step (the
smoothing margin, the conflict levels of ``label``, one chunk per block) is in
the package docstring, :mod:`daisy_nb.demo`.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

NOISE = 0.8
BLOB_DENSITY = 1.0 / 3000.0  # blobs per voxel
BLOB_RADII = (2.0, 5.0)
TASKS = ("generate", "smooth", "threshold", "label", "resolve", "relabel")

# ---------------------------------------------------------------------------------------------
# small helpers (used in the workers: plain data in, plain data out)
# ---------------------------------------------------------------------------------------------


def _triple(v, name: str) -> tuple[int, int, int]:
    """An int or a 'Z,Y,X' string / sequence -> a positive 3-tuple."""
    if isinstance(v, str):
        parts = [p for p in v.replace("x", ",").split(",") if p.strip()]
        v = [int(p) for p in parts]
    if isinstance(v, (int, np.integer)):
        v = [int(v)] * 3
    v = tuple(int(x) for x in v)
    if len(v) == 1:
        v = v * 3
    if len(v) != 3 or any(x <= 0 for x in v):
        raise ValueError(f"{name} must be a positive int or three positive ints Z,Y,X, got {v!r}")
    return v


def _slices(begin, end, origin) -> tuple[slice, ...]:
    """Array index slices of the world box [begin, end) in an array whose index 0 is ``origin``."""
    return tuple(slice(int(b) - int(o), int(e) - int(o)) for b, e, o in zip(begin, end, origin))


def _box(roi):
    return tuple(int(v) for v in roi.begin), tuple(int(v) for v in roi.end)


def _open(p: dict, name: str, mode: str = "r"):
    import zarr

    return zarr.open_array(os.path.join(p["zarr"], name), mode=mode)


def _grid_index(p: dict, write_begin) -> int:
    """Linear (C-order) index of the output block whose write region starts at ``write_begin``."""
    g = tuple(int(b) // bs for b, bs in zip(write_begin, p["block"]))
    return int(np.ravel_multi_index(g, p["grid"]))


def _inject_failure(p: dict, task: str, block) -> bool:
    """``--fail-fraction``: deterministically fail a fraction of one task's blocks (this run only)."""
    if p.get("fail_fraction", 0) <= 0 or p.get("fail_task") != task:
        return False
    wb, _ = _box(block.write_roi)
    key = [int(p["seed"]), 99, TASKS.index(task)] + [int(v) + 10**6 for v in wb]
    if np.random.default_rng(key).random() < p["fail_fraction"]:
        if p.get("multiprocessing", True):
            # a worker logs this and the summary shows it as the task's first failure
            raise RuntimeError(f"injected failure of {task} block {wb} (--fail-fraction); finish with --resume")
        from daisy_nb.block import BlockStatus

        block.status = BlockStatus.FAILED  # in-process runs re-raise exceptions: fail quietly
        return True
    return False


def _atomic_save(path: str, **arrays) -> None:
    """Write an .npz (or one .npy if ``path`` ends with .npy) so readers never see a torn file."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            if path.endswith(".npy"):
                (arr,) = arrays.values()
                np.save(f, arr)
            else:
                np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _blobs(p: dict) -> np.ndarray:
    """The blob table (n, 5): centre z, y, x, radius, amplitude. A pure function of the params."""
    rng = np.random.default_rng([int(p["seed"]), 1])
    lo = np.array(p["raw_offset"], dtype=np.float64)
    shape = np.array(p["raw_shape"], dtype=np.float64)
    n = max(1, int(round(float(np.prod(shape)) * BLOB_DENSITY)))
    centres = lo + rng.random((n, 3)) * shape
    radii = rng.uniform(*BLOB_RADII, size=(n, 1))
    amps = rng.uniform(0.6, 1.2, size=(n, 1))
    return np.hstack([centres, radii, amps])


# ---------------------------------------------------------------------------------------------
# block functions
# ---------------------------------------------------------------------------------------------


def generate_block(p: dict, block) -> None:
    """Task 1: raw = sum of Gaussian blobs + white noise, on this block's chunk of ``raw``."""
    if _inject_failure(p, "generate", block):
        return
    wb, we = _box(block.write_roi)
    # this block's write ROI is exactly one chunk of raw (see "one block writes one chunk")
    _open(p, "raw", "r+")[_slices(wb, we, p["raw_offset"])] = generate_values(p, wb, we)


def generate_values(p: dict, wb, we) -> np.ndarray:
    """The raw values (float32) of the world box ``[wb, we)``, which must be one chunk of ``raw``
    (the noise is seeded per chunk): a pure function of the parameters and the box."""
    vol = np.zeros(tuple(e - b for b, e in zip(wb, we)), dtype=np.float64)
    blobs = _blobs(p)
    # each blob covers the box |x - centre| <= 4 r (per axis); add it where that box meets the
    # block. Every voxel gets the same terms in the same order whichever block computes it.
    lo = np.ceil(blobs[:, :3] - 4.0 * blobs[:, 3:4]).astype(np.int64)
    hi = np.floor(blobs[:, :3] + 4.0 * blobs[:, 3:4]).astype(np.int64) + 1
    lo = np.maximum(lo, wb)
    hi = np.minimum(hi, we)
    for i in np.flatnonzero(np.all(lo < hi, axis=1)):
        cz, cy, cx, r, a = blobs[i]
        prof = [
            np.exp(-0.5 * ((np.arange(lo_d, hi_d, dtype=np.float64) - c) / r) ** 2)
            for lo_d, hi_d, c in zip(lo[i], hi[i], (cz, cy, cx))
        ]
        box = tuple(slice(lo_d - b, hi_d - b) for lo_d, hi_d, b in zip(lo[i], hi[i], wb))
        vol[box] += a * prof[0][:, None, None] * prof[1][None, :, None] * prof[2][None, None, :]
    # noise seeded per chunk: reproducible whichever worker runs the block, in any order
    chunk = [(b - o) // bs for b, o, bs in zip(wb, p["raw_offset"], p["block"])]
    rng = np.random.default_rng([int(p["seed"]), 2, *chunk])
    vol += NOISE * rng.standard_normal(vol.shape)
    return vol.astype(np.float32)


def smooth_block(p: dict, block) -> None:
    """Task 2: Gaussian smoothing with context: filter the read ROI, keep the write ROI."""
    from scipy import ndimage

    if _inject_failure(p, "smooth", block):
        return
    rb, re_ = _box(block.read_roi)
    wb, we = _box(block.write_roi)
    r = p["radius"]
    if any(w - q < r for w, q in zip(wb, rb)) or any(q - w < r for w, q in zip(we, re_)):
        raise RuntimeError(f"block {block.block_id}: context smaller than the kernel radius {r}")
    data = _open(p, "raw")[_slices(rb, re_, p["raw_offset"])]  # may span many raw chunks: fine
    sm = ndimage.gaussian_filter(data, p["sigma"], truncate=p["truncate"])
    crop = _slices(wb, we, rb)
    _open(p, "smoothed", "r+")[_slices(wb, we, (0, 0, 0))] = sm[crop]


def threshold_block(p: dict, block) -> None:
    """Task 3: mask = smoothed > threshold."""
    if _inject_failure(p, "threshold", block):
        return
    wb, we = _box(block.write_roi)
    sl = _slices(wb, we, (0, 0, 0))
    sm = _open(p, "smoothed")[sl]
    _open(p, "mask", "r+")[sl] = (sm > p["threshold"]).astype(np.uint8)


def label_block(p: dict, block) -> None:
    """Task 4 (read_write_conflict=True): local labels with global ids + merge pairs with the
    already-labelled face neighbours (read from the one-voxel context)."""
    from scipy import ndimage

    if _inject_failure(p, "label", block):
        return
    wb, we = _box(block.write_roi)
    size = p["size"]
    sl = _slices(wb, we, (0, 0, 0))
    mask = _open(p, "mask")[sl]
    local, n = ndimage.label(mask)  # 6-connectivity, like the whole-volume reference
    gidx = _grid_index(p, wb)
    dtype = np.dtype(p["label_dtype"])
    frag = np.where(local > 0, local.astype(np.uint64) + np.uint64(gidx * p["block_voxels"]), 0).astype(dtype)
    fragments = _open(p, "fragments", "r+")
    fragments[sl] = frag  # exactly this block's chunk

    pairs = []
    for d in range(3):
        for side in (0, 1):
            # the one-voxel slab just outside this block's face: inside its read ROI
            pos = wb[d] - 1 if side == 0 else we[d]
            if pos < 0 or pos >= size[d]:
                continue  # volume boundary: nothing there
            b = list(wb)
            e = list(we)
            b[d], e[d] = pos, pos + 1
            other = fragments[_slices(b, e, (0, 0, 0))]
            own = [slice(None)] * 3  # this block's own face layer, next to that slab
            own[d] = slice(0, 1) if side == 0 else slice(-1, None)
            face = frag[tuple(own)]
            touch = (face > 0) & (other > 0)
            if touch.any():
                pairs.append(np.stack([face[touch], other[touch]], axis=1).astype(np.uint64))
    pairs = np.unique(np.concatenate(pairs), axis=0) if pairs else np.zeros((0, 2), dtype=np.uint64)
    _atomic_save(os.path.join(p["merges"], f"block_{gidx}.npz"), n=np.int64(n), pairs=pairs)


def _node(ids: np.ndarray, offsets: np.ndarray, p: dict) -> np.ndarray:
    """Fragment ids (``block * V + local``, ``local`` from 1) -> union-find node indices (``offsets[block] + local - 1``)."""
    ids = ids.astype(np.uint64) - np.uint64(1)
    V = np.uint64(p["block_voxels"])
    return offsets[(ids // V).astype(np.int64)] + (ids % V).astype(np.int64)


def resolve_block(p: dict, block) -> None:
    """Task 5 (one block, after every label block): union-find over all merge pairs."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nblocks = int(np.prod(p["grid"]))
    counts = np.zeros(nblocks, dtype=np.int64)
    pairs = []
    for i in range(nblocks):
        path = os.path.join(p["merges"], f"block_{i}.npz")
        with np.load(path) as z:
            counts[i] = int(z["n"])
            pairs.append(z["pairs"])
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    pairs = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.uint64)
    total = int(offsets[-1])
    a, b = _node(pairs[:, 0], offsets, p), _node(pairs[:, 1], offsets, p)
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(total, total))
    ncomp, comp = connected_components(graph, directed=False)
    final = (comp + 1).astype(p["label_dtype"])
    _atomic_save(p["table_labels"], labels=final)
    _atomic_save(p["table_offsets"], offsets=offsets)


def relabel_block(p: dict, block) -> None:
    """Task 6: labels = table[fragments]."""
    if _inject_failure(p, "relabel", block):
        return
    wb, we = _box(block.write_roi)
    sl = _slices(wb, we, (0, 0, 0))
    frag = _open(p, "fragments")[sl]
    offsets = np.load(p["table_offsets"], mmap_mode="r")
    final = np.load(p["table_labels"], mmap_mode="r")
    fg = frag > 0
    nodes = _node(frag[fg], np.asarray(offsets), p)
    out = np.zeros(frag.shape, dtype=np.dtype(p["label_dtype"]))
    out[fg] = np.asarray(final[nodes]) if len(nodes) else 0
    _open(p, "labels", "r+")[sl] = out


_BLOCK_FUNCTIONS = {
    "generate": generate_block,
    "smooth": smooth_block,
    "threshold": threshold_block,
    "label": label_block,
    "resolve": resolve_block,
    "relabel": relabel_block,
}

"""``python -m daisy_nb demo``: a real blockwise pipeline on a zarr volume, checked against scipy.

What it does (all in one output directory, default ``./daisy_nb_demo``):

1. ``generate``  writes a synthetic noisy 3-D volume (random Gaussian blobs plus white noise,
   reproducible from ``--seed``) into ``volume.zarr/raw``, one zarr chunk per block;
2. ``smooth``    Gaussian smoothing *with context*: each block reads its write region grown by
   the filter radius, runs ``scipy.ndimage.gaussian_filter`` on that and keeps the centre;
3. ``threshold`` ``smoothed > threshold`` -> ``mask`` (uint8);
4. ``label``     blockwise connected components, ``read_write_conflict=True`` (see below);
5. ``resolve``   one block: union-find over the merge pairs of all blocks -> a relabel table;
6. ``relabel``   every block maps its fragment ids through the table -> ``labels``.

Then the demo loads the whole volume and recomputes everything at once with scipy/numpy
(``gaussian_filter`` on the whole raw volume, ``> threshold``, ``scipy.ndimage.label``) and
reports whether the blockwise result agrees (labels compared up to a permutation, with a
bijection check). ``main`` returns 0 iff it agrees.

Boundary handling of the smoothing
----------------------------------
The raw volume is generated with a margin of ``radius = int(truncate * sigma + 0.5)`` voxels
(scipy's own kernel radius) on every side: raw covers world ``[-r, size + r)``, the outputs
cover ``[0, size)``. Every output voxel therefore has its whole kernel support inside the raw
volume, so the blockwise result equals ``gaussian_filter(raw)[r:-r, r:-r, r:-r]`` exactly (bit
for bit: the filter is separable and each output line sees the same inputs in the same order),
whatever boundary ``mode`` is used. Without the margin, voxels within ``r`` of the volume
boundary would depend on the padding mode and differ between a block and the whole volume.

Connected components across blocks (the step whose correctness needs conflict levels)
----------------------------------------------------------------------------------------
``label`` has a read ROI one voxel larger than its write ROI on every side and
``read_write_conflict=True``. daisy then puts blocks into levels (2^3 in 3-D, block stride 2 per
axis) and a block only starts after every earlier-level neighbour whose *write* ROI meets its
*read* ROI has finished; same-level blocks never touch. So for every pair of face-adjacent blocks
exactly one runs after the other, and that later one can see the earlier one's final labels in
its one-voxel context.

A block labels its own write region with ``scipy.ndimage.label`` (6-connectivity, scipy's
default) and makes the ids globally unique with a block offset: ``id = block_index * V + local``
(``V`` = voxels per block, so ids never collide). It writes these "fragments" to
``volume.zarr/fragments`` and then reads the six one-voxel face slabs just outside its write
region from ``fragments``: wherever a foreground voxel of its own face touches a nonzero
neighbour voxel, the two fragments are the same object and the pair is recorded. Neighbours of
later levels have not run yet (reads give the fill value 0); they record the pair themselves
when they run. The pairs go to a small per-block file ``merges/block_<index>.npz`` (written
atomically). Without the conflict levels two adjacent blocks could run at the same time, both
see zeros and the merge would be lost (or a block could read a half-written chunk).

``resolve`` (a single block whose read ROI is the whole volume, so it waits for every label
block) loads all merge files and runs union-find (connected components of the fragment graph,
``scipy.sparse.csgraph``) giving each fragment its final label ``1..N``; ``relabel`` maps each
block's fragments through that table. The result equals ``scipy.ndimage.label`` of the whole
mask up to a permutation of label values.

Zarr rule: one block writes one chunk
-------------------------------------
zarr stores each chunk as one object; writing *part* of a chunk is read-modify-write of the
whole chunk. If two workers wrote different parts of the same chunk at the same time, one
would silently overwrite the other's voxels. So every array here has ``chunks == write shape``
and its chunk grid starts where the task's block grid starts (``raw``'s array origin is world
``-r`` and so is the ``generate`` task's total ROI; the other arrays start at world 0 like
their tasks' write grids). Each block's write ROI is then exactly one chunk (or the leading
part of one chunk at the upper boundary with ``fit="shrink"``), and no two blocks ever write
the same chunk. Reads may span many chunks: the scheduler only starts a block once the
upstream blocks it reads from are done, so what it reads is final.

Block functions run in worker processes: they are module-level functions bound to plain
parameters (paths and numbers) with ``functools.partial`` and open the zarr arrays themselves,
by path, in every call. Nothing open (arrays, files) is captured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from .blocks import _BLOCK_FUNCTIONS, TASKS, _triple
from .check import check_result, same_partition, same_partition_sorted

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_SIZE",
    "TASKS",
    "add_arguments",
    "check_result",
    "main",
    "run_demo",
    "same_partition",
    "same_partition_sorted",
]

DEFAULT_SIZE = 320
DEFAULT_BLOCK = 64
DEFAULT_OUT = "daisy_nb_demo"
DEFAULT_SEED = 1

SIGMA = 1.5
TRUNCATE = 4.0
RADIUS = int(TRUNCATE * SIGMA + 0.5)  # scipy's kernel radius: the smoothing context
THRESHOLD = 0.5

FAILABLE = ("generate", "smooth", "threshold", "label", "relabel")
_MARKER = "demo.json"


# ---------------------------------------------------------------------------------------------
# set-up: parameters, arrays, tasks
# ---------------------------------------------------------------------------------------------


def _paths(out: Path) -> dict:
    return {
        "out": str(out),
        "zarr": str(out / "volume.zarr"),
        "merges": str(out / "merges"),
        "table_labels": str(out / "relabel" / "labels.npy"),
        "table_offsets": str(out / "relabel" / "offsets.npy"),
    }


def _params(out: Path, size, block, seed) -> dict:
    size, block = _triple(size, "size"), _triple(block, "block")
    grid = tuple(-(-s // b) for s, b in zip(size, block))
    block_voxels = int(np.prod(block))
    r = RADIUS
    max_id = int(np.prod(grid)) * block_voxels
    return {
        "version": 1,
        **_paths(out),
        "size": list(size),
        "block": list(block),
        "grid": list(grid),
        "block_voxels": block_voxels,
        "raw_offset": [-r] * 3,
        "raw_shape": [s + 2 * r for s in size],
        "sigma": SIGMA,
        "truncate": TRUNCATE,
        "radius": r,
        "threshold": THRESHOLD,
        "seed": int(seed),
        "label_dtype": "uint32" if max_id < 2**32 else "uint64",
    }


_OUTPUTS = ("volume.zarr", "merges", "relabel", "tracking", "logs", _MARKER)


def _prepare_fresh(out: Path, p: dict) -> None:
    """Clear a previous demo's outputs (never an unrelated directory) and create the arrays."""
    import zarr

    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a directory")
        entries = [e for e in out.iterdir()]
        if entries and not (out / _MARKER).exists():
            raise FileExistsError(
                f"{out} is not empty and holds no {_MARKER}: refusing to overwrite it (choose another --out)"
            )
        for name in _OUTPUTS:
            q = out / name
            if q.is_dir() and not q.is_symlink():
                shutil.rmtree(q)
            elif q.exists() or q.is_symlink():
                q.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / "merges").mkdir()
    (out / "relabel").mkdir()

    # chunks == block write shape, and each array's index 0 sits where its task's block grid
    # starts: every block writes exactly one chunk (see the module docstring).
    root = zarr.open_group(p["zarr"], mode="w", zarr_format=3)
    root.attrs.update({"description": "daisy_nb demo (python -m daisy_nb demo)", "world_units": "voxels"})
    common = {"chunks": tuple(p["block"]), "fill_value": 0}
    specs = [
        (
            "raw",
            p["raw_shape"],
            "float32",
            p["raw_offset"],
            "synthetic blobs + noise (with a margin of the smoothing radius)",
        ),
        (
            "smoothed",
            p["size"],
            "float32",
            [0, 0, 0],
            f"gaussian_filter(raw, sigma={p['sigma']}, truncate={p['truncate']})",
        ),
        ("mask", p["size"], "uint8", [0, 0, 0], f"smoothed > {p['threshold']}"),
        (
            "fragments",
            p["size"],
            p["label_dtype"],
            [0, 0, 0],
            "per-block connected components, ids block_index * block_voxels + local",
        ),
        (
            "labels",
            p["size"],
            p["label_dtype"],
            [0, 0, 0],
            "connected components of mask (6-connectivity), 0 = background",
        ),
    ]
    for name, shape, dtype, offset, desc in specs:
        root.create_array(
            name,
            shape=tuple(shape),
            dtype=dtype,
            attributes={"offset": list(offset), "voxel_size": [1, 1, 1], "description": desc},
            **common,
        )
    (out / _MARKER).write_text(json.dumps(p, indent=2) + "\n")


def _load_for_resume(out: Path, size, block, seed) -> dict:
    marker = out / _MARKER
    if not marker.exists():
        raise FileNotFoundError(f"nothing to resume in {out} (no {_MARKER}); run the demo without --resume first")
    p = json.loads(marker.read_text())
    for name, given in (("size", size), ("block", block)):
        if given is not None and list(_triple(given, name)) != p[name]:
            raise ValueError(
                f"--resume: {name} {list(_triple(given, name))} differs from the interrupted run's {p[name]}"
            )
    if seed is not None and int(seed) != p["seed"]:
        raise ValueError(f"--resume: seed {seed} differs from the interrupted run's {p['seed']}")
    if p.get("version") != 1:
        raise ValueError(f"{marker} was written by another version of the demo; run without --resume")
    p.update(_paths(out))  # the directory may have been moved since
    return p


def build_pipeline(p: dict, workers: int = 2):
    """The six tasks of the demo, chained (each ``+`` makes every block of the next task wait for
    the blocks of the previous one whose write ROI meets its read ROI)."""
    import daisy_nb as daisy
    from daisy_nb import Roi

    S, B, r = p["size"], p["block"], p["radius"]
    zero = (0, 0, 0)
    track = Path(p["out"]) / "tracking"

    # --fail-fraction makes blocks raise, and (as in daisy 2.0) each raising attempt ends its
    # worker; let every block have its attempts rather than abandon the task after 10 restarts
    restarts = 10 if not p.get("fail_fraction") else 1_000_000

    def task(tid, total, read, write, conflict):
        fn = functools.partial(_BLOCK_FUNCTIONS[tid], p)
        return daisy.Task(
            tid,
            total_roi=total,
            read_roi=read,
            write_roi=write,
            process_function=fn,
            read_write_conflict=conflict,
            fit="shrink",
            max_workers=workers,
            max_retries=2,
            tracking_path=str(track / tid),
            requires={"cpu": 1},
            max_worker_restarts=restarts,
        )

    volume = Roi(zero, S)
    blk = Roi(zero, B)
    tasks = [
        # raw covers [-r, S + r): one block per raw chunk
        task("generate", Roi(p["raw_offset"], p["raw_shape"]), blk, blk, False),
        # read = write grown by the kernel radius r; writes tile [0, S)
        task(
            "smooth", Roi((-r,) * 3, [s + 2 * r for s in S]), Roi(zero, [b + 2 * r for b in B]), Roi((r,) * 3, B), False
        ),
        task("threshold", volume, blk, blk, False),
        # read = write grown by 1 (the neighbours' faces); conflict levels order adjacent blocks
        task("label", Roi((-1,) * 3, [s + 2 for s in S]), Roi(zero, [b + 2 for b in B]), Roi((1,) * 3, B), True),
        # one block reading everything: runs after the last label block
        task("resolve", volume, volume, volume, False),
        task("relabel", volume, blk, blk, False),
    ]
    pipeline = tasks[0]
    for t in tasks[1:]:
        pipeline = pipeline + t
    return pipeline, tasks


# ---------------------------------------------------------------------------------------------
# the demo
# ---------------------------------------------------------------------------------------------


def _counts(states) -> dict:
    return {
        tid: {
            "total": st.total_block_count,
            "completed": st.completed_count,
            "skipped": st.skipped_count,
            "failed": st.failed_count,
            "orphaned": st.orphaned_count,
        }
        for tid, st in states.items()
    }


def _nbytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def run_demo(
    out_dir=DEFAULT_OUT,
    size=None,
    block=None,
    workers: int = 2,
    resume: bool = False,
    multiprocessing: bool = True,
    seed=None,
    fail_fraction: float = 0.0,
    fail_task: str = "label",
    progress: bool = True,
    summary: bool = True,
    check: bool = True,
    verbose: bool = True,
    dashboard=None,
    report=None,
) -> dict:
    """Run the demo pipeline in ``out_dir`` and check it against the whole-volume computation.

    ``size``/``block``: an int (cube) or three ints (defaults 320 and 64; with ``resume`` the
    interrupted run's). ``workers``: block functions running at once (a global budget; each task
    may use them all). ``resume=True`` keeps the volume and the block tracking of an earlier run
    in ``out_dir`` and only runs unfinished blocks. ``fail_fraction`` fails that fraction of
    ``fail_task``'s blocks in this run (deterministically, to demonstrate ``resume``).
    ``dashboard``/``report``: as in :func:`daisy_nb.run_blockwise` (a port number, ``True``, a
    :class:`daisy_nb.dashboard.Dashboard`; a path for the HTML run report).

    Returns a dict with ``agrees`` (bool), ``complete``, ``interrupted``, ``checks``,
    ``timings`` (seconds), ``states`` (``{task_id: TaskState}``) and ``counts`` (plain ints).
    """
    import daisy_nb as daisy

    say = print if verbose else (lambda *a, **k: None)
    if isinstance(workers, bool) or int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")
    workers = int(workers)
    if not 0.0 <= float(fail_fraction) <= 1.0:
        raise ValueError(f"fail_fraction must be between 0 and 1, got {fail_fraction!r}")
    if fail_task not in FAILABLE:
        raise ValueError(f"fail_task must be one of {', '.join(FAILABLE)}, got {fail_task!r}")
    out = Path(out_dir).expanduser().resolve()
    t_start = time.monotonic()
    if resume:
        p = _load_for_resume(out, size, block, seed)
    else:
        p = _params(
            out,
            DEFAULT_SIZE if size is None else size,
            DEFAULT_BLOCK if block is None else block,
            DEFAULT_SEED if seed is None else seed,
        )
        _prepare_fresh(out, p)
    run_p = dict(p, fail_fraction=float(fail_fraction), fail_task=fail_task, multiprocessing=bool(multiprocessing))

    S, B = p["size"], p["block"]
    nvox = int(np.prod(S))
    say(
        f"daisy_nb demo: volume {'x'.join(map(str, S))} ({nvox * 4 / 2**20:.0f} MiB as float32), "
        f"blocks {'x'.join(map(str, B))} ({int(np.prod(p['grid']))} per task), "
        f"{workers} worker{'s' if workers != 1 else ''}{'' if multiprocessing else ' (serial, in-process)'}"
    )
    say(f"output: {out}" + ("  [resuming: finished blocks are skipped]" if resume else ""))
    if fail_fraction > 0:
        say(f"injecting failures: {fail_fraction:.0%} of the '{fail_task}' blocks fail in this run")

    pipeline, _ = build_pipeline(run_p, workers)
    kwargs = {
        "multiprocessing": multiprocessing,
        "return_states": True,
        "progress": progress,
        "summary": summary,
        "log_dir": str(out / "logs"),
        "dashboard": dashboard,
        "report": report,
    }
    if multiprocessing:
        kwargs["resources"] = {"cpu": workers}
    interrupted = False
    t0 = time.monotonic()
    try:
        states = daisy.run_blockwise(pipeline, **kwargs)
    except KeyboardInterrupt as e:
        states = getattr(e, "daisy_states", None)
        if states is None:
            raise
        interrupted = True
    t_run = time.monotonic() - t0

    counts = _counts(states)
    complete = not interrupted and all(c["completed"] == c["total"] for c in counts.values())
    result = {
        "out_dir": str(out),
        "zarr": p["zarr"],
        "size": list(S),
        "block": list(B),
        "workers": workers,
        "multiprocessing": bool(multiprocessing),
        "resumed": bool(resume),
        "interrupted": interrupted,
        "complete": complete,
        "agrees": False,
        "checks": None,
        "states": states,
        "counts": counts,
        "timings": {"pipeline": t_run},
    }
    if resume:
        skipped = sum(c["skipped"] for c in counts.values())
        say(
            f"resume: {skipped} finished blocks were skipped by block tracking "
            f"(" + ", ".join(f"{t} {c['skipped']}/{c['total']}" for t, c in counts.items()) + ")"
        )
    if not complete:
        bad = sum(c["total"] - c["completed"] for c in counts.values())
        say(
            f"\nrun {'interrupted' if interrupted else 'incomplete'}: {bad} blocks not done. "
            f"Finish it with:  python -m daisy_nb demo --out {out} --resume"
        )
    elif check:
        say("\nchecking against the whole-volume computation (scipy.ndimage on the full arrays) ...")
        t1 = time.monotonic()
        checks = check_result(p)
        result["timings"]["check"] = time.monotonic() - t1
        result["checks"] = checks
        result["agrees"] = checks["agrees"]
        lab = checks["labels"]
        say(
            f"  smoothed == gaussian_filter(whole raw) cropped: {checks['smoothed']['equal']} "
            f"(max |diff| {checks['smoothed']['max_abs_diff']:.3g})"
        )
        say(
            f"  mask == (whole smoothed > {p['threshold']}):             {checks['mask']['equal']} "
            f"(foreground {checks['mask']['foreground_fraction']:.1%})"
        )
        say(
            f"  labels == scipy.ndimage.label up to permutation: {lab['equal_up_to_permutation']} "
            f"({lab['components']} objects; {lab['fragments']} block fragments merged, "
            f"{lab['objects_spanning_blocks']} objects span several blocks)"
        )
        say(
            "AGREE: the blockwise result equals the whole-volume computation"
            if checks["agrees"]
            else "DISAGREE: the blockwise result differs from the whole-volume computation"
        )
    result["timings"]["total"] = time.monotonic() - t_start
    if complete:
        say(
            f"\nresult: {p['zarr']}  (arrays raw, smoothed, mask, fragments, labels; "
            f"{_nbytes(Path(p['zarr'])) / 2**20:.0f} MiB on disk)"
        )
        say(
            f"  open it:  python3 -c \"import zarr; a = zarr.open_array('{p['zarr']}/labels'); "
            f"print(a.shape, a.dtype, a[:].max(), 'objects')\""
        )
    say(
        f"time: pipeline {t_run:.1f}s"
        + (f", check {result['timings']['check']:.1f}s" if "check" in result["timings"] else "")
        + f", total {result['timings']['total']:.1f}s"
    )
    return result


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m daisy_nb demo``."""
    parser.add_argument(
        "--size",
        default=None,
        metavar="N|Z,Y,X",
        help=f"volume size in voxels (default {DEFAULT_SIZE}; with --resume: the interrupted run's)",
    )
    parser.add_argument(
        "--block", default=None, metavar="N|Z,Y,X", help=f"block (= zarr chunk) size (default {DEFAULT_BLOCK})"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes running blocks at once (default 2)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default ./{DEFAULT_OUT})")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out: block tracking skips finished blocks",
    )
    parser.add_argument(
        "--fail-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="make this fraction of the --fail-task blocks fail in this run, to try --resume",
    )
    parser.add_argument(
        "--fail-task", default="label", choices=FAILABLE, help="task whose blocks --fail-fraction fails"
    )
    parser.add_argument("--seed", type=int, default=None, help=f"random seed of the volume (default {DEFAULT_SEED})")
    parser.add_argument("--serial", action="store_true", help="run the blocks in this process (no workers)")
    parser.add_argument("--no-check", action="store_true", help="skip the whole-volume comparison")
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="also write the result (counts, checks, timings) as JSON"
    )
    parser.add_argument(
        "--dashboard",
        nargs="?",
        type=int,
        const=0,
        default=None,
        metavar="PORT",
        help="serve the live dashboard on 127.0.0.1 (PORT, default a free one; the URL, with its token, is printed); on a "
        "terminal it stays up after the run until Enter",
    )
    parser.add_argument("--report", default=None, metavar="FILE.html", help="write the HTML run report there")


def main(args) -> int:
    """Run the demo from parsed arguments; 0 iff the blockwise result agrees with scipy."""
    import importlib.util

    missing = [m for m in ("zarr", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"daisy_nb demo: error: it needs {' and '.join(missing)}: pip install 'daisy_nb[demo]'",
            file=sys.stderr,
        )
        return 2
    dash = None
    port = getattr(args, "dashboard", None)
    if port is not None:
        from daisy_nb.dashboard import Dashboard

        try:
            dash = Dashboard(port=port).start()  # prints its URL
        except (OSError, TypeError, ValueError) as e:
            print(f"daisy_nb demo: error: {e}", file=sys.stderr)
            return 2
    try:
        return _main(args, dash)
    finally:
        if dash is not None:
            if sys.stdin is not None and sys.stdin.isatty():
                try:
                    input(f"dashboard still at {dash.url} — press Enter to stop it ")
                except (EOFError, KeyboardInterrupt):
                    pass
            dash.close()


def _main(args, dash) -> int:
    try:
        res = run_demo(
            args.out,
            size=args.size,
            block=args.block,
            workers=args.workers,
            resume=args.resume,
            multiprocessing=not args.serial,
            seed=args.seed,
            fail_fraction=args.fail_fraction,
            fail_task=args.fail_task,
            check=not args.no_check,
            dashboard=dash,
            report=getattr(args, "report", None),
        )
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"daisy_nb demo: error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", None):
        doc = {k: v for k, v in res.items() if k != "states"}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if res["interrupted"]:
        return 130
    if args.no_check:
        return 0 if res["complete"] else 1
    return 0 if res["agrees"] else 1


def _cli(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m daisy_nb demo",
        description="Blockwise smoothing, thresholding and connected components of a synthetic zarr volume, "
        "checked against the same computation on the whole volume.",
    )
    add_arguments(parser)
    return main(parser.parse_args(argv))

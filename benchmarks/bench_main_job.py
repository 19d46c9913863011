"""The main job side by side: ``python -m daisy_nb demo`` against daisy 2.0.0 and dask-image.

    python benchmarks/bench_main_job.py --daisy-python /work/venv-daisy2/bin/python \\
        --dask-python /work/venv-dimg/bin/python [--quick] [--repeat 3] [--configs 320/64,320/32,512/64] \\
        [--variants nb,daisy2,threads,distributed] [--nb-env NAME=VALUE,...] [--nb-python PYTHON]

The README's main job (``daisy_nb/demo``: generate a noisy zarr volume, smooth it with
context, threshold, label blockwise with conflict levels, resolve the merges in one block,
relabel; then the check of the result against scipy on the whole volume), 2 workers, as

  nb           ``python -m daisy_nb demo --size S --block B`` (the command a user types)
  daisy2       the same six tasks, block functions and budget (``requires={"cpu": 1}``,
               ``resources={"cpu": 2}``) on daisy 2.0.0 (``--daisy-python``), on its defaults:
               its progress bars (tqdm) and its summary, as the demo shows daisy_nb's (runs
               recorded before 2026-12-06 turned daisy's off: 0.7 MiB less in its peak)
  threads      the same pipeline written for dask-image (``dask_image.ndfilters.gaussian_filter``,
               ``dask_image.ndmeasure.label``, ``da.store`` into the same zarr arrays, chunks =
               blocks), dask's threaded scheduler with 2 threads (``--dask-python``; measured with
               dask-image 2024.5.3 and dask 2024.12.1: dask 2026.8 builds a label graph 30x larger,
               16 s before the first task at 64³ in 16³ chunks)
  distributed  the same graph on ``dask.distributed.LocalCluster(n_workers=2, threads_per_worker=1)``

each followed by the same check (``daisy_nb.demo.check_result``: the whole volume
recomputed with scipy). The daisy2 and dask children import the demo's block functions and
set-up from ``daisy_nb/demo`` as a stand-alone package (a symlink, ``nbdemo``), never
``daisy_nb`` itself.

Every run is a fresh process tree started by this script, after an ``os.sync()`` (so the
write-back of the previous run's output does not land in it); the variants alternate (the
order rotates with each repeat) and each figure is the median of ``--repeat`` runs:

  wall        whole process, start to exit (interpreter start, imports, pipeline, check)
  peak        ``ru_maxrss`` that ``wait4`` returns: the largest process of the tree
  sum         the largest sum of the tree's RSS, sampled every 50 ms (shared pages counted
              in every process: forked workers make it an upper bound)

A second table splits each median into its two phases as the child measured them: the
pipeline (``run_blockwise``; for dask, building the graph, the cluster's start and the compute) and the check
after it, the same code for every runner (the demo prints both; the other children print the
same line).

For daisy_nb and daisy 2.0.0 the block functions are wrapped (:class:`Traced`) to append each
block's start and end, its process and the first-call imports (``zarr``, and what that
task's function imports from scipy, timed apart, before the block's clock starts) to a trace
file, from which the second table reports the use of the 2 worker slots: block time /
(2 x span from the first block's start to the last block's end), the gap before each task's
first block (from the previous task's last block end; the first from the process start),
the worker processes each task ran in and their imports. The trace adds ~0.1 ms per block.

``--nb-python``: the interpreter daisy_nb runs in (default: this one). Give it a virtual
environment with the same packages as ``--daisy-python``'s (``pip install -e .[demo]`` next to
``pip install daisy==2.0.0 zarr scipy``): zarr imports ``fsspec`` whenever it is installed (dask's
test extras bring it), ~12 ms and ~4 MiB in every process, which would be charged to daisy_nb.

``--quick``: one repeat at 128³ with 32³ blocks. Before the tables, every variant runs once at
64³ (16³ blocks) and the script compares checksums of ``smoothed`` and ``mask`` (bytes) and of
``labels`` in a canonical form (ids renumbered in order of first appearance): the four
compute the same thing or the script stops.

``--nb-env NAME=VALUE`` adds a daisy_nb column with that environment (e.g. ``DAISY_NB_JIT=0``),
and ``--base REF`` a column of daisy_nb as of that git commit (``git archive`` into a temporary
directory, its kernels compiled there first), both run in the same rotation: a change measured
before/after side by side.

Why the peaks may differ by a few MiB when nothing either process holds does: glibc serves a
``malloc`` above its mmap threshold with a mapping of its own, and raises the threshold to the
size of any such chunk freed. The interpreter's table of interned strings (the identifiers of
all code loaded) is rebuilt twice as large after 21,845 insertions, and its old 408 KiB table
freed. daisy_nb's scheduler is Python code: its process passes that line during the run, while
daisy's program ends its run ~1,000 insertions short of it (measured at 128³). From then on the
threshold is 408 KiB instead of ~228 KiB, so the check's allocations in between (a 64³ chunk of
the uint8 mask is 256 KiB) come from the malloc arenas of zarr's threads instead of mappings
that are returned when freed: ~2 MiB more at the check's peak at 512³. ``--mmap-threshold BYTES``
runs every child with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at ``BYTES`` (131072 is glibc's
starting value), which takes that allocator state out of the comparison.

Set ``DAISY_NB_BENCH_RECORD`` to append the tables to a JSON-lines file (``docs/performance/``).
"""

from __future__ import annotations

# The children (``--worker``: daisy 2.0.0's program, the traced and the dask ones) import this
# module, and what it imports stays in their main process through the check, where the peak
# is: only what they use is imported at the top (``python -m daisy_nb demo`` carries no harness,
# so neither may daisy's program); the parent's tools are imported where the parent uses them.
import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

WORKERS = 2
TRACE_ENV = "BENCH_MAIN_JOB_TRACE"
VARIANTS = ("nb", "daisy2", "threads", "distributed")
TITLES = {
    "nb": "daisy_nb",
    "daisy2": "daisy 2.0.0",
    "threads": "dask-image, threads",
    "distributed": "dask-image, distributed",
}
# what each task's block function imports besides numpy and zarr (timed apart by Traced)
TASK_IMPORTS = {
    "generate": (),
    "smooth": ("scipy.ndimage",),
    "threshold": (),
    "label": ("scipy.ndimage",),
    "resolve": ("scipy.sparse", "scipy.sparse.csgraph"),
    "relabel": (),
}


# ------------------------------------------------------------------ the traced block functions
_TRACE_FD: list = []  # [(pid, fd)] of this process's trace file
_IMPORTED: set = set()  # tasks whose imports this process has timed


class Traced:
    """A demo block function that appends ``task pid start end imports`` to the trace file.

    Picklable by reference (this module is importable in the workers: its directory is on
    their ``PYTHONPATH``). The first call in a process imports ``zarr`` and the task's scipy
    modules before the block's clock starts and records that time apart."""

    def __init__(self, task: str, fn, p: dict, path: str):
        self.task, self.fn, self.p, self.path = task, fn, p, path

    def __call__(self, block):
        imports = 0.0
        if self.task not in _IMPORTED:
            t = time.time()
            import importlib

            for m in ("zarr", *TASK_IMPORTS[self.task]):
                importlib.import_module(m)
            imports = time.time() - t
            _IMPORTED.add(self.task)
        if not _TRACE_FD or _TRACE_FD[0][0] != os.getpid():
            _TRACE_FD[:] = [(os.getpid(), os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))]
        t0 = time.time()
        self.fn(self.p, block)
        t1 = time.time()
        os.write(_TRACE_FD[0][1], f"{self.task} {os.getpid()} {t0:.6f} {t1:.6f} {imports:.6f}\n".encode())


def _nbdemo_path(tmp: str) -> str:
    """A directory holding ``nbdemo`` -> ``daisy_nb/demo``: the demo without the daisy_nb package."""
    d = os.path.join(tmp, "nbdemo_path")
    os.makedirs(d, exist_ok=True)
    link = os.path.join(d, "nbdemo")
    if not os.path.exists(link):
        os.symlink(os.path.join(ROOT, "daisy_nb", "demo"), link)
    return d


# ----------------------------------------------------------------------------- children
def child_nb_traced(size: int, block: int, out: str, trace: str) -> int:
    """``python -m daisy_nb demo`` with traced block functions (same arguments, same check)."""
    import daisy_nb.demo as demo
    from daisy_nb.demo import blocks

    if trace:
        orig = dict(blocks._BLOCK_FUNCTIONS)
        for tid, fn in orig.items():
            blocks._BLOCK_FUNCTIONS[tid] = _traced_factory(tid, fn, trace)
        demo._BLOCK_FUNCTIONS = blocks._BLOCK_FUNCTIONS
    return demo._cli(["--size", str(size), "--block", str(block), "--out", out, "--workers", str(WORKERS)])


def _traced_factory(tid, fn, trace):
    # build_pipeline binds ``functools.partial(fn, p)``: a callable taking p first
    return _Bind(tid, fn, trace)


class _Bind:
    """``_Bind(task, fn, trace)(p, block)``: what ``functools.partial(self, p)`` calls."""

    def __init__(self, task, fn, trace):
        self.task, self.fn, self.trace = task, fn, trace

    def __call__(self, p, block):
        Traced(self.task, self.fn, p, self.trace)(block)


def child_daisy2(size: int, block: int, out: str, trace: str) -> int:
    """The demo's six tasks on daisy 2.0.0, then the same check."""
    from pathlib import Path

    import daisy
    import nbdemo
    from nbdemo import blocks

    outp = Path(out).resolve()
    p = nbdemo._params(outp, size, block, nbdemo.DEFAULT_SEED)
    nbdemo._prepare_fresh(outp, p)
    S, B, r = p["size"], p["block"], p["radius"]
    zero = (0, 0, 0)

    def task(tid, total, read, write, conflict):
        fn = blocks._BLOCK_FUNCTIONS[tid]
        pf = Traced(tid, fn, p, trace) if trace else _Partial(fn, p)
        return daisy.Task(
            tid,
            total_roi=total,
            read_roi=read,
            write_roi=write,
            process_function=pf,
            read_write_conflict=conflict,
            fit="shrink",
            max_workers=WORKERS,
            max_retries=2,
            requires={"cpu": 1},
        )

    R = daisy.Roi
    tasks = [
        task("generate", R(p["raw_offset"], p["raw_shape"]), R(zero, B), R(zero, B), False),
        task("smooth", R((-r,) * 3, [s + 2 * r for s in S]), R(zero, [b + 2 * r for b in B]), R((r,) * 3, B), False),
        task("threshold", R(zero, S), R(zero, B), R(zero, B), False),
        task("label", R((-1,) * 3, [s + 2 for s in S]), R(zero, [b + 2 for b in B]), R((1,) * 3, B), True),
        task("resolve", R(zero, S), R(zero, S), R(zero, S), False),
        task("relabel", R(zero, S), R(zero, B), R(zero, B), False),
    ]
    pipeline = tasks[0]
    for t in tasks[1:]:
        pipeline = pipeline + t
    # the demo's budget: 2 block functions at once over all tasks (daisy_nb demo: resources={"cpu": workers});
    # progress bars and summary on, as daisy's defaults and the demo's
    t0 = time.monotonic()
    ok = daisy.run_blockwise(pipeline, multiprocessing=True, resources={"cpu": WORKERS}, progress=True, summary=True)
    if not ok:
        print("daisy 2.0.0: run failed", file=sys.stderr)
        return 1
    return _checked(nbdemo, p, time.monotonic() - t0)


def _checked(nbdemo, p: dict, t_run: float) -> int:
    """The check, and the two phases' seconds in the demo's own words (:func:`phases` reads them)."""
    t0 = time.monotonic()
    agrees = nbdemo.check_result(p)["agrees"]
    print(f"time: pipeline {t_run:.2f}s, check {time.monotonic() - t0:.2f}s", flush=True)
    return 0 if agrees else 1


def phases(log: str) -> tuple[float, float] | None:
    """The pipeline's and the check's seconds from a child's output: the demo's closing line
    (``time: pipeline 17.9s, check 5.8s, total 23.9s``), which the other runners' children print too."""
    m = re.search(r"time: pipeline ([0-9.]+)s, check ([0-9.]+)s", log)
    return (float(m.group(1)), float(m.group(2))) if m else None


class _Partial:
    def __init__(self, fn, p):
        self.fn, self.p = fn, p

    def __call__(self, block):
        self.fn(self.p, block)


def child_dask(size: int, block: int, out: str, distributed: bool) -> int:
    """The pipeline written for dask-image: one graph stored into the demo's zarr arrays."""
    from pathlib import Path

    import dask
    import dask.array as da
    import nbdemo
    import numpy as np
    import zarr
    from dask_image import ndfilters, ndmeasure
    from nbdemo import blocks

    outp = Path(out).resolve()
    p = nbdemo._params(outp, size, block, nbdemo.DEFAULT_SEED)
    nbdemo._prepare_fresh(outp, p)
    S, B, r = p["size"], p["block"], p["radius"]
    off = p["raw_offset"]

    t0 = time.monotonic()  # the pipeline: building the graph (label computes part of it), the cluster, the compute

    def gen(block_info=None):
        loc = block_info[None]["array-location"]
        wb = [lo + o for (lo, _), o in zip(loc, off)]
        we = [hi + o for (_, hi), o in zip(loc, off)]
        return blocks.generate_values(p, wb, we)

    raw = da.map_blocks(gen, chunks=tuple(_chunks(n, b) for n, b in zip(p["raw_shape"], B)), dtype=np.float32)
    sm = ndfilters.gaussian_filter(raw, p["sigma"], truncate=p["truncate"])
    sm = sm[tuple(slice(r, r + s) for s in S)].rechunk(tuple(B))
    mask = (sm > p["threshold"]).astype(np.uint8)
    labels, _n = ndmeasure.label(mask)
    labels = labels.astype(p["label_dtype"]).rechunk(tuple(B))
    root = zarr.open_group(p["zarr"], mode="r+")
    targets = [root["raw"], root["smoothed"], root["mask"], root["labels"]]
    if distributed:
        from dask.distributed import Client, LocalCluster

        with (
            LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
            Client(cluster),
        ):
            da.store([raw, sm, mask, labels], targets, lock=False)
    else:
        with dask.config.set(scheduler="threads", num_workers=WORKERS):
            da.store([raw, sm, mask, labels], targets, lock=False)
    return _checked(nbdemo, p, time.monotonic() - t0)


def _chunks(n: int, b: int) -> tuple:
    return tuple([b] * (n // b) + ([n % b] if n % b else []))


def child_main(argv: list[str]) -> int:
    variant, size, block, out, trace = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    trace = "" if trace == "-" else trace
    if variant == "nb":
        return child_nb_traced(size, block, out, trace)
    if variant == "daisy2":
        return child_daisy2(size, block, out, trace)
    return child_dask(size, block, out, variant == "distributed")


# ----------------------------------------------------------------------------- parent side
def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        try:
            for tid in os.listdir(f"/proc/{q}/task"):
                with open(f"/proc/{q}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, IndexError, ValueError):
        return 0


def run_one(python: str, args: list[str], env_extra: dict, cwd: str, timeout: float = 1800) -> dict:
    """Start a process tree, wait for it with ``wait4``: wall, ru_maxrss, sampled RSS sum."""
    import subprocess
    import tempfile
    import threading

    import _util

    env = _util.child_env(env_extra)
    env.setdefault("PYTHONWARNINGS", "ignore")
    # dask.distributed keeps its scratch space (and lock files it leaves) under dask's temporary
    # directory, /tmp by default: the run's directory instead, removed at the end
    env.setdefault("DASK_TEMPORARY_DIRECTORY", cwd)
    log = tempfile.TemporaryFile(mode="w+")
    os.sync()  # the previous run's output (GBs at 512³) is written back now, not during this run
    t0 = time.time()
    proc = subprocess.Popen([python, *args], env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    peak_sum = [0]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.05):
            peak_sum[0] = max(peak_sum[0], sum(_rss_kb(q) for q in _tree(proc.pid)))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        stop.set()
        th.join()
    wall = time.time() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read()
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {proc.returncode}):\n{text[-4000:]}")
    ph = phases(text)
    return {
        "wall": wall,
        "peak": ru.ru_maxrss * 1024,
        "sum": peak_sum[0] * 1024,
        "t0": t0,
        "log": text,
        "pipeline": ph[0] if ph else float("nan"),
        "check": ph[1] if ph else float("nan"),
    }


def variant_cmd(variant: str, pythons: dict, size: int, block: int, out: str, trace: str) -> tuple[str, list]:
    me = os.path.abspath(__file__)
    if variant == "nb" and not trace:
        return pythons["nb"], ["-m", "daisy_nb", "demo", "--size", str(size), "--block", str(block), "--out", out]
    base = "nb" if variant.startswith("nb") else variant
    if variant == "nb@base" and not trace:
        return pythons["nb"], ["-m", "daisy_nb", "demo", "--size", str(size), "--block", str(block), "--out", out]
    py = pythons["dask"] if base in ("threads", "distributed") else pythons[base]
    return py, [me, "--worker", base, str(size), str(block), out, trace or "-"]


def trace_stats(trace: str, t_start: float) -> dict:
    rows = []
    with open(trace) as f:
        for line in f:
            task, pid, a, b, imp = line.split()
            rows.append((task, int(pid), float(a), float(b), float(imp)))
    order = ["generate", "smooth", "threshold", "label", "resolve", "relabel"]
    first = min(r[2] for r in rows)
    last = max(r[3] for r in rows)
    busy = sum(r[3] - r[2] for r in rows)
    imports = sum(r[4] for r in rows)
    gaps, prev_end = [], t_start
    pids_per_task = {}
    for t in order:
        rs = [r for r in rows if r[0] == t]
        gaps.append(max(0.0, min(r[2] for r in rs) - prev_end))
        prev_end = max(r[3] for r in rs)
        pids_per_task[t] = len({r[1] for r in rs})
    return {
        "util": busy / (WORKERS * (last - first)),
        "busy": busy,
        "span": last - first,
        "gaps": gaps,
        "procs": len({r[1] for r in rows}),
        "procs_per_task": pids_per_task,
        "imports": imports,
        "blocks": len(rows),
    }


def checksums(out: str) -> dict:
    """Bytes of smoothed and mask; labels renumbered in order of first appearance."""
    import hashlib

    import numpy as np
    import zarr

    res = {}
    for name in ("smoothed", "mask", "labels"):
        a = zarr.open_array(os.path.join(out, "volume.zarr", name), mode="r")[...]
        if name == "labels":
            flat = a.reshape(-1)
            uniq, first, inv = np.unique(flat, return_index=True, return_inverse=True)
            rank = np.empty(len(uniq), dtype=np.int64)
            order = np.argsort(first, kind="stable")
            rank[order] = np.arange(len(uniq))
            if len(uniq) and uniq[0] == 0:
                rank = rank - rank[0]  # background stays 0 only if it appears first; fine for a hash
            a = rank[inv.reshape(-1)]
        res[name] = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    return res


def mib(x: float) -> str:
    return f"{x / 2**20:.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    ap.add_argument("--daisy-python", default="/work/venv-daisy2/bin/python")
    ap.add_argument("--dask-python", default="/work/venv-dimg/bin/python")
    ap.add_argument("--nb-python", default=sys.executable)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--configs", default="320/64,320/32,512/64")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--nb-env", default="", help="NAME=VALUE[,NAME=VALUE]: an extra daisy_nb column with that env")
    ap.add_argument("--base", default="", help="git ref: an extra column of daisy_nb as of that commit")
    ap.add_argument("--no-checksum", action="store_true")
    ap.add_argument(
        "--mmap-threshold", type=int, default=0, help="BYTES: every child runs with MALLOC_MMAP_THRESHOLD_=BYTES"
    )
    a = ap.parse_args()
    if a.worker is not None:
        import bench_main_job  # this file as a module: its classes pickle by reference

        return bench_main_job.child_main(a.worker)
    import shutil
    import statistics
    import subprocess
    import tempfile

    import _util

    configs = [(128, 32)] if a.quick else [tuple(int(x) for x in c.split("/")) for c in a.configs.split(",")]
    repeat = 1 if a.quick else a.repeat
    variants = [v for v in a.variants.split(",") if v]
    extra = dict(kv.split("=", 1) for kv in a.nb_env.split(",") if kv)
    if extra:
        variants.insert(1, "nb+env")
    if a.base:
        variants.insert(1, "nb@base")
    pythons = {"nb": a.nb_python, "daisy2": a.daisy_python, "dask": a.dask_python}
    note = _util.as_installed(a.nb_python)
    if os.path.abspath(a.nb_python) == os.path.abspath(sys.executable):
        _util.warm_daisy_nb()
    else:
        subprocess.run(
            [a.nb_python, "-m", "daisy_nb", "warmup"], check=True, env=_util.child_env(), stdout=subprocess.DEVNULL
        )
    fixed = f"; every child with MALLOC_MMAP_THRESHOLD_={a.mmap_threshold}" if a.mmap_threshold else ""
    print(f"# bench_main_job: {_util.machine_note()}" + (f"; {note}" if note else "") + fixed, flush=True)
    tmp = tempfile.mkdtemp(prefix="bench_main_job_")
    nbdemo = _nbdemo_path(tmp)
    try:
        env_for = {}
        base_root = _export_base(a.base, tmp) if a.base else ""
        for v in variants:
            e = {"PYTHONPATH": os.pathsep.join([HERE, nbdemo, base_root if v == "nb@base" else ROOT])}
            if a.mmap_threshold:
                e["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
            if v == "nb+env":
                e.update(extra)
            env_for[v] = e

        if not a.no_checksum:
            sums = {}
            for v in variants:
                out = os.path.join(tmp, f"check_{v.replace('+', '_')}")
                py, args = variant_cmd(v, pythons, 64, 16, out, "")
                run_one(py, args, env_for[v], tmp)
                sums[v] = checksums(out)
                shutil.rmtree(out)
            print("checksums at 64³/16³ blocks: " + json.dumps(sums), flush=True)
            if len({json.dumps(s, sort_keys=True) for s in sums.values()}) != 1:
                print("the variants compute different results: stopping", file=sys.stderr)
                return 1

        rows, trace_rows, phase_rows = [], [], []
        for size, block in configs:
            res: dict = {v: [] for v in variants}
            traces: dict = {v: [] for v in variants if v.startswith("nb") or v == "daisy2"}
            for i in range(repeat):
                order = variants[i % len(variants) :] + variants[: i % len(variants)]
                for v in order:
                    out = os.path.join(tmp, "out")
                    trace = ""
                    if v in traces:
                        # one file per run: the traced block functions append to it
                        trace = os.path.join(tmp, f"trace_{v.replace('+', '_')}_{size}_{block}_{i}.txt")
                    py, args = variant_cmd(v, pythons, size, block, out, trace)
                    r = run_one(py, args, env_for[v], tmp)
                    res[v].append(r)
                    if trace:
                        traces[v].append(trace_stats(trace, r["t0"]))
                        os.unlink(trace)
                    print(
                        f"  {size}³/{block}³ {v:12s} run {i + 1}: {r['wall']:.2f} s, peak {mib(r['peak'])}, "
                        f"sum {mib(r['sum'])}" + (f", util {traces[v][-1]['util']:.0%}" if trace else ""),
                        flush=True,
                    )
                    shutil.rmtree(out, ignore_errors=True)
            keys = ("wall", "peak", "sum", "pipeline", "check")
            med = {v: {k: statistics.median(x[k] for x in res[v]) for k in keys} for v in variants}

            label = f"{size}³, {block}³"
            whole, phase = [label], [label]
            for v in variants:
                m = med[v]
                x = {
                    k: f" ({m[k] / med['nb'][k]:.2f}x)" if v != "nb" and "nb" in med else ""
                    for k in ("wall", "pipeline")
                }
                whole.append(f"{m['wall']:.2f} s{x['wall']}; {mib(m['peak'])} / {mib(m['sum'])}")
                phase.append(f"{m['pipeline']:.2f} s{x['pipeline']} / {m['check']:.2f} s")
            rows.append(whole)
            phase_rows.append(phase)
            for v, ts in traces.items():
                if not ts:
                    continue
                pick = sorted(ts, key=lambda t: t["util"])[len(ts) // 2]
                trace_rows.append(
                    [
                        f"{size}³, {block}³",
                        _title(v, extra),
                        f"{statistics.median(t['util'] for t in ts):.0%}",
                        f"{pick['busy']:.1f} s / {pick['span']:.1f} s",
                        " ".join(f"{g:.2f}" for g in pick["gaps"]),
                        f"{pick['procs']} ({' '.join(str(n) for n in pick['procs_per_task'].values())})",
                        f"{pick['imports']:.2f} s",
                        pick["blocks"],
                    ]
                )
        headers = ["volume, block", *[_title(v, extra) for v in variants]]
        print(
            f"\nWhole process (wall, median of {repeat}, ratio to daisy_nb; peak = wait4 ru_maxrss of the "
            "largest process / sum = sampled RSS sum of the tree)\n"
        )
        print(_util.table(headers, rows))
        print(
            "\nThe two phases (median of the runs, as each child measured them): the pipeline (``run_blockwise``, "
            "or for dask its graph, its cluster's start and the compute; ratio to daisy_nb) / the check that follows it, the "
            "same code for every runner\n"
        )
        print(_util.table(headers, phase_rows))
        if trace_rows:
            print(
                "\nWorker slots from the block trace (median run by use): use = block time / (2 x span); gaps "
                "before each task's first block (s; the first from process start); worker processes "
                "(per task); first-call imports in all\n"
            )
            print(
                _util.table(
                    ["volume, block", "runner", "use", "blocks / span", "gaps", "workers", "imports", "blocks"],
                    trace_rows,
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _export_base(ref: str, tmp: str) -> str:
    """daisy_nb as of git ``ref`` in ``tmp/base``, its kernels compiled there (before any clock)."""
    import subprocess

    import _util

    root = os.path.join(tmp, "base")
    os.makedirs(root)
    arch = subprocess.run(["git", "-C", ROOT, "archive", ref, "daisy_nb"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=arch, check=True)
    env = _util.child_env({"PYTHONPATH": root})
    subprocess.run([sys.executable, "-m", "daisy_nb", "warmup"], env=env, cwd=tmp, check=True, capture_output=True)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        import compileall

        compileall.compile_dir(os.path.join(root, "daisy_nb"), quiet=1)
    BASE_REF[0] = ref
    return root


BASE_REF = [""]


def _title(v: str, extra: dict) -> str:
    if v == "nb@base":
        return f"daisy_nb {BASE_REF[0]}"
    if v == "nb+env":
        return "daisy_nb " + " ".join(f"{k}={val}" for k, val in extra.items())
    return TITLES[v]


if __name__ == "__main__":
    sys.exit(main())

"""The main job's peak memory taken apart: each runner's main process just before the check.

    python benchmarks/bench_main_memory.py --nb-python PYTHON --daisy-python /work/venv-daisy2/bin/python \\
        [--size 128] [--block 64] [--repeat 3] [--base REF] [--quick]

``bench_main_job.py``'s peak is the main process's during the demo's check (the whole volume
in memory, the same code for every runner), so the runners differ by what their main process
holds when the check starts: the scheduler's code and what the run left behind. This script
runs the same main job as ``bench_main_job.py``'s timed runs (the demo's command line, and its
daisy2 variant on daisy 2.0.0, both on their defaults, both started through that script's
children, so that both processes hold its module, as they do there) at a small size. It
replaces the check by a probe that reads ``/proc/self/status`` (``VmRSS``, and its anonymous
and file-backed parts; ``VmHWM``, the main process's peak through the pipeline: the scheduler's
side of the run, its workers apart), the number of modules loaded and the bytes of the scheduler library's
own Python code (its functions' code objects with their bytecode, line tables, names and
constants: most of what daisy_nb's process holds beyond daisy's, whose core is native code in
a shared library), and exits. The runners alternate; each figure is the median of
``--repeat`` runs. ``--base REF`` adds daisy_nb as of a git commit (before/after in one run).
Without daisy 2.0.0 (no ``--daisy-python`` interpreter), daisy_nb alone; ``--quick``: one run
at 64³ with 32³ blocks.

Set ``DAISY_NB_BENCH_RECORD`` to append the table to a JSON-lines file (``docs/performance/``).
"""

from __future__ import annotations

# what a child imports stays in its memory: the parent's tools are imported where the parent
# uses them, and daisy_nb's child imports nothing of the harness (as ``python -m daisy_nb demo``)
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def _probe(p) -> None:
    """In place of the check: this process's memory, as one JSON line; then exit."""
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in FIELDS:
                d[k] = int(v.split()[0]) * 1024
    d["modules"] = len(sys.modules)
    d["code"] = _code_bytes("daisy_nb" if "daisy_nb" in sys.modules else "daisy")
    print("PROBE " + json.dumps(d), flush=True)
    os._exit(0)


def _code_bytes(package: str) -> int:
    """Bytes of the scheduler library's own Python code in this process (read after the memory
    above): every function of ``package``'s modules (the demo's apart: it is the same code for
    every runner) with its code object, bytecode, line tables, names and constants, nested
    functions' code included. daisy 2.0.0's core is Rust, so its Python code is the wrapper's."""
    import gc
    import types

    seen: set[int] = set()
    total = 0

    def add(o) -> None:
        nonlocal total
        if id(o) not in seen:
            seen.add(id(o))
            total += sys.getsizeof(o)

    def code(co: types.CodeType) -> None:
        if id(co) in seen:
            return
        add(co)
        for attr in ("co_code", "co_linetable", "co_exceptiontable", "co_names", "co_varnames", "co_consts"):
            add(getattr(co, attr))
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                code(c)
            elif isinstance(c, (str, bytes, tuple, frozenset)):
                add(c)

    def own(module) -> bool:
        m = module or ""
        return (m == package or m.startswith(package + ".")) and not m.startswith(package + ".demo")

    for o in gc.get_objects():
        if isinstance(o, types.FunctionType) and own(o.__module__):
            add(o)
            code(o.__code__)
    return total


def child(variant: str, size: int, block: int, out: str) -> int:
    """bench_main_job.py's children, as its timed runs start them (both hold its module; the
    check replaced by the probe): daisy 2.0.0's program, and the demo's command line."""
    import bench_main_job

    if variant == "daisy2":
        import nbdemo

        nbdemo.check_result = _probe
        return bench_main_job.child_daisy2(size, block, out, "")
    import daisy_nb.demo

    daisy_nb.demo.check_result = _probe
    return bench_main_job.child_nb_traced(size, block, out, "")


def run(python: str, variant: str, env: dict, size: int, block: int, out: str) -> dict:
    import subprocess
    import tempfile

    import _util

    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(prefix="daisy_nb_bench_") as cwd:  # daisy's worker logs land in the cwd
        r = subprocess.run(
            [python, me, "--child", variant, str(size), str(block), out],
            capture_output=True,
            text=True,
            env=_util.child_env(env),
            cwd=cwd,
            timeout=600,
        )
    lines = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    if not lines:
        raise RuntimeError(f"{variant}: no probe (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("PROBE ") :])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=4)
    ap.add_argument("--nb-python", default=sys.executable)
    ap.add_argument("--daisy-python", default="/work/venv-daisy2/bin/python")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--base", default="", help="git ref: an extra column of daisy_nb as of that commit")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.child:
        v, size, block, out = a.child
        return child(v, int(size), int(block), out)

    import statistics
    import tempfile

    import _util
    import bench_main_job

    if a.quick:
        a.size, a.block, a.repeat = 64, 32, 1
    note = _util.as_installed()
    print(f"# bench_main_memory: {_util.machine_note()}" + (f"; {note}" if note else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_main_memory_") as tmp:
        nbdemo = bench_main_job._nbdemo_path(tmp)
        variants = {"nb": (a.nb_python, ROOT)}
        if a.base:
            variants["nb@base"] = (a.nb_python, bench_main_job._export_base(a.base, tmp))
        if os.path.exists(a.daisy_python):
            variants["daisy2"] = (a.daisy_python, ROOT)
        res: dict = {v: [] for v in variants}
        for i in range(a.repeat):
            order = list(variants)
            order = order[i % len(order) :] + order[: i % len(order)]
            for v in order:
                py, root = variants[v]
                out = os.path.join(tmp, f"out_{v.replace('@', '_')}_{i}")
                env = {"PYTHONPATH": os.pathsep.join([HERE, nbdemo, root])}
                r = run(py, v if v != "nb@base" else "nb", env, a.size, a.block, out)
                res[v].append(r)
                mb = {k: r[k] / 1e6 for k in FIELDS}
                print(
                    f"  {v:8s} run {i + 1}: RSS {mb['VmRSS']:.2f} MB (anonymous {mb['RssAnon']:.2f}, "
                    f"file {mb['RssFile']:.2f}), peak so far {mb['VmHWM']:.2f} MB, {r['modules']} modules, "
                    f"{r['code'] / 1e6:.2f} MB of its code",
                    flush=True,
                )
    titles = {"nb": "daisy_nb", "nb@base": f"daisy_nb {a.base}", "daisy2": "daisy 2.0.0"}
    rows = []
    for v, rs in res.items():
        med = {k: statistics.median(r[k] for r in rs) for k in (*FIELDS, "modules", "code")}
        rows.append([titles[v], *(f"{med[k] / 1e6:.2f} MB" for k in (*FIELDS, "code")), f"{med['modules']:.0f}"])
    print(
        f"\nThe main process before the check ({a.size}³ volume, {a.block}³ blocks; median of {a.repeat}):\n"
        + _util.table(
            ["runner", "RSS", "anonymous", "file-backed", "peak so far", "the library's Python code", "modules"], rows
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

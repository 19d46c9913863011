"""Shared helpers of the benchmark scripts (subprocesses, memory probes, tables).

Every figure a benchmark reports is measured in a child interpreter started by
:func:`spawn` (the same script with ``--worker ...``), which prints one
``RESULT {json}`` line. The parent only schedules the children and prints tables,
so that daisy 2.0.0 (in its own virtual environment) and daisy_nb are timed the
same way, in the same run.

Memory: :func:`reset_peak` writes ``5`` to ``/proc/self/clear_refs``, which resets
the kernel's peak-RSS mark (``VmHWM``, and with it ``ru_maxrss``) to the current
RSS, so ``peak_rss() - rss()`` measured around a call is that call's own peak,
not the interpreter's earlier high-water mark (imports, JIT warm-up). Where the
file is not writable the delta is an upper bound and is flagged.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# -- child processes ----------------------------------------------------------------
def child_env(extra: dict | None = None) -> dict:
    """Environment for a child: daisy_nb from this checkout, no stray threads."""
    env = dict(os.environ)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")
    # one thread per library: the machine is small and shared
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "RAYON_NUM_THREADS"):
        env.setdefault(k, "1")
    env.update(extra or {})
    return env


def spawn(python: str, script: str, args: list[str], env_extra: dict | None = None, timeout: float = 1800) -> dict:
    """Run ``python script --worker args...`` in a fresh interpreter, in a fresh working directory
    removed afterwards (the runs' worker logs land there); return its RESULT dict."""
    cmd = [python, script, "--worker", *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="daisy_nb_bench_") as cwd:
        r = subprocess.run(cmd, capture_output=True, text=True, env=child_env(env_extra), cwd=cwd, timeout=timeout)
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child failed ({' '.join(cmd)}), rc={r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def emit(result: dict) -> None:
    """Child side: print the one RESULT line the parent parses."""
    print("RESULT " + json.dumps(result), flush=True)


def fake_batch_env(folder: str, extra: dict | None = None) -> dict:
    """A child environment whose ``sbatch`` and ``scancel`` are the fakes of
    ``tests/workers/fakebatch.py`` (jobs run on this machine, each in its own session), with their
    state in ``folder/state`` and the commands in ``folder/bin``; ``extra`` is added."""
    state, bin_dir = os.path.join(folder, "state"), os.path.join(folder, "bin")
    os.makedirs(state, exist_ok=True)
    os.makedirs(bin_dir, exist_ok=True)
    fake = os.path.join(ROOT, "tests", "workers", "fakebatch.py")
    for role in ("sbatch", "scancel"):
        p = os.path.join(bin_dir, role)
        with open(p, "w") as f:
            f.write(f'#!/bin/sh\nexec {sys.executable} {fake} {role} "$@"\n')
        os.chmod(p, 0o755)
    env = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "FAKEBATCH_DIR": state}
    env.update(extra or {})
    return child_env(env)


# -- memory ---------------------------------------------------------------------------
def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss() -> int:
    """Current resident set size in bytes."""
    return _status_kb("VmRSS") * 1024


def peak_rss() -> int:
    """``ru_maxrss`` in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    """Reset the peak-RSS mark to the current RSS; False if the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRss:
    """``with PeakRss() as m: ...`` then ``m.delta``: the block's peak RSS above the RSS at entry."""

    def __enter__(self):
        self.exact = reset_peak()
        self.before = rss()
        return self

    def __exit__(self, *exc):
        self.delta = max(0, peak_rss() - self.before)
        self.after = rss()


# -- statistics and formatting ---------------------------------------------------------
def stats(xs: list[float]) -> dict:
    """best / median / worst of repeated timings and the spread (worst/best - 1)."""
    xs = sorted(xs)
    return {
        "best": xs[0],
        "median": statistics.median(xs),
        "worst": xs[-1],
        "n": len(xs),
        "spread": xs[-1] / xs[0] - 1 if xs[0] > 0 else 0.0,
        "all": xs,
    }


def fmt_secs(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_timing(st: dict) -> str:
    """``best (median, +spread% over n)``."""
    if st["n"] == 1:
        return fmt_secs(st["best"])
    return f"{fmt_secs(st['best'])} (med {fmt_secs(st['median'])}, ±{st['spread'] * 100:.0f}% over {st['n']})"


def fmt_rate(blocks: int, st: dict) -> str:
    """Blocks/s at the best time, with the range over the repeats."""
    best = blocks / st["best"]
    if st["n"] == 1:
        return f"{best:,.0f}/s"
    worst = blocks / st["worst"]
    return f"{best:,.0f}/s (worst {worst:,.0f}, n={st['n']})"


def fmt_ratio(x: float, lo: float | None = None, hi: float | None = None) -> str:
    s = f"{x:,.1f}x" if x < 100 else f"{x:,.0f}x"
    if lo is not None and hi is not None:
        s += f" [{lo:,.1f}–{hi:,.1f}]" if hi < 100 else f" [{lo:,.0f}–{hi:,.0f}]"
    return s


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value < target
    return "met" if ok else "**MISSED**"


RECORD_ENV = "DAISY_NB_BENCH_RECORD"


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; also appended to the JSON-lines file ``$DAISY_NB_BENCH_RECORD`` when set.

    The docs' performance page is generated from such files committed under
    ``docs/performance/`` (``docs/_hooks/generate.py``), never typed by hand."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    record = os.environ.get(RECORD_ENV)
    if record:
        import datetime

        entry = {
            "script": os.path.basename(sys.argv[0]),
            "args": sys.argv[1:],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_note(),
            "headers": [str(h) for h in headers],
            "rows": [[str(c) for c in r] for r in rows],
        }
        with open(record, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return "\n".join(out)


def machine_note() -> str:
    """One line about the machine and its load when the run started (the figures are noisy)."""
    try:
        load = os.getloadavg()
        la = f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    except OSError:
        la = "load average n/a"
    return f"{os.cpu_count()} CPUs, {la}, python {sys.version.split()[0]}"


def as_installed(*pythons: str) -> str:
    """Measure daisy_nb as an installed program runs, or say why not; returns a note (or "").

    * **Byte-compiled.** When the environment forbids Python to write ``.pyc`` files
      (``PYTHONDONTWRITEBYTECODE``), daisy_nb and the benchmarks' own modules (whose block
      functions every worker of both libraries imports) are compiled here: otherwise every
      process (the scheduler, the worker template, each worker program) compiles them from
      source, a cost no installed program has (bench_heavy_tail.py: ~3 ms in each of 32 workers).
    * **No editable finder.** ``pip install -e .`` (setuptools >= 64, this flat layout) installs
      a ``.pth`` hook that imports ``pathlib``, ``importlib.util`` and their imports at every
      interpreter start: ``python -c pass`` takes 17 ms instead of 8 on these machines. Every
      process daisy_nb starts pays it (the worker template, each exec'd worker, each cluster
      job), and a wheel install (daisy 2.0.0's, a user's ``pip install daisy_nb``) does not. The
      note names each of ``pythons`` (default: this one) that loads daisy_nb so;
      ``pip install -e . --config-settings editable_mode=compat`` installs a plain path entry.
    """
    notes = []
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        import compileall

        compileall.compile_dir(os.path.join(ROOT, "daisy_nb"), quiet=1)
        compileall.compile_dir(HERE, quiet=1, maxlevels=0)
        notes.append(
            "daisy_nb and the benchmarks byte-compiled first (PYTHONDONTWRITEBYTECODE is set here; an installed "
            "program has .pyc files)"
        )
    for py in dict.fromkeys(pythons or (sys.executable,)):
        if editable_finder(py):
            notes.append(
                f"WARNING: {py} loads daisy_nb through setuptools' editable finder, ~9 ms more in every "
                "interpreter daisy_nb starts than a wheel install: pip install -e . --config-settings "
                "editable_mode=compat"
            )
    return "\n".join(notes)


EDITABLE_FINDER = "__editable___daisy_nb"  # the module setuptools' editable .pth hook imports


def editable_finder(python: str) -> bool:
    """Whether ``python`` imports setuptools' editable finder for daisy_nb as it starts."""
    probe = f"import sys; print(any(m.startswith({EDITABLE_FINDER!r}) for m in sys.modules))"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.strip() == "True"


def warm_daisy_nb() -> float:
    """Compile or load every daisy_nb kernel (before any clock starts); returns its seconds."""
    sys.path.insert(0, ROOT)
    import daisy_nb.warmup

    return daisy_nb.warmup.warmup()

"""Run daisy's own test suite on daisy 2.0.0 and on daisy_nb, and compare test by test.

    python benchmarks/run_daisy_suite.py /path/to/daisy            # a checkout of funkelab/daisy (branch v2.0)
    python benchmarks/run_daisy_suite.py /path/to/daisy --daisy-python /work/venv-daisy2/bin/python
    python benchmarks/run_daisy_suite.py /path/to/daisy -- -k server   # pytest arguments after --

The suite runs from the checkout's root (some of its tests start
``tests/daisy_compat/*.py`` by a relative path). daisy 2.0.0 runs it with
``--daisy-python``; daisy_nb runs the same files unchanged through
``python -m daisy_nb run -m pytest`` (with ``--nb-python``, default: this Python), so
``import daisy`` in the tests and in every worker program they start is daisy_nb.
Without ``--daisy-python`` only the daisy_nb side runs.

Two files test private parts of the wheel and are left out on both sides:
``test_done_marker.py`` (imports ``daisy._runner``) and ``test_topo_order.py``
(imports ``daisy._daisy``).

Prints the per-file counts and every test whose outcome differs. Exit code 0 if
every test that passes on daisy 2.0.0 passes on daisy_nb (or, without
``--daisy-python``, if nothing failed on daisy_nb), 1 otherwise, 2 for bad input.
This project does not copy daisy's tests; it only runs a checkout given to it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time

PRIVATE_FILES = ("test_done_marker.py", "test_topo_order.py")
OUTCOME_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)")


def find_root(path: str) -> str:
    """The checkout root: ``path`` itself if it has ``tests/``, its parent if ``path`` is ``tests/``."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "tests")):
        return path
    if os.path.basename(path) == "tests" and os.path.isdir(path):
        return os.path.dirname(path)
    raise ValueError(f"checkout: {path} has no tests/ directory (give the daisy checkout or its tests/)")


def pytest_args(root: str, timeout: int, extra) -> list[str]:
    args = ["tests", "-rA", "-q", "-p", "no:cacheprovider", "--timeout", str(timeout)]
    for name in PRIVATE_FILES:
        for dirpath, _, files in os.walk(os.path.join(root, "tests")):
            if name in files:
                args.append("--ignore=" + os.path.relpath(os.path.join(dirpath, name), root))
    return args + list(extra)


def run_suite(cmd: list[str], root: str, log_path: str | None, junit: str | None = None) -> tuple[dict, str, float]:
    """Run ``cmd`` in ``root``; returns ({test id: outcome}, the last line of output, seconds).

    With ``junit`` (a path the command writes with ``--junitxml``), outcomes come from that file,
    one per test; otherwise from pytest's ``-rA`` lines.
    """
    t0 = time.monotonic()
    proc = subprocess.run(cmd, check=False, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    secs = time.monotonic() - t0
    if log_path:
        with open(log_path, "w") as f:
            f.write(proc.stdout)
    results = {}
    if junit:
        results = junit_outcomes(junit, root) if os.path.exists(junit) else {}
    else:
        for line in proc.stdout.splitlines():
            m = OUTCOME_RE.match(line)
            if m:
                # "FAILED id - message": keep the id only
                results[m.group(2)] = m.group(1)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"(no output, exit code {proc.returncode})"
    return results, tail, secs


def junit_outcomes(path: str, root: str) -> dict:
    """{pytest node id: PASSED/FAILED/ERROR/SKIPPED} from a pytest ``--junitxml`` file."""
    import xml.etree.ElementTree as ET

    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # classname is "dir.module[.Class]": the module is the longest prefix that is a file
        for i in range(len(parts), 0, -1):
            if os.path.isfile(os.path.join(root, *parts[:i]) + ".py"):
                node = "/".join(parts[:i]) + ".py::" + "::".join([*parts[i:], case.get("name", "")])
                break
        else:
            node = case.get("classname", "") + "::" + case.get("name", "")
        tags = {child.tag for child in case}
        outcome = (
            "ERROR"
            if "error" in tags
            else "FAILED"
            if "failure" in tags
            else "SKIPPED"
            if "skipped" in tags
            else "PASSED"
        )
        # a test that fails and then errors in teardown has two entries: keep the worse
        if results.get(node) not in ("FAILED", "ERROR"):
            results[node] = outcome
    return results


def per_file(results: dict) -> dict:
    counts = collections.defaultdict(collections.Counter)
    for test_id, outcome in results.items():
        counts[test_id.split("::")[0]][outcome] += 1
    return counts


def parse_suite_args(argv, description: str, checkout: str, daisy: str, nb: str, timeout: int, log_dir: str):
    """The options both suite runners take: ``(args, pytest args after --, checkout root)``;
    ``None`` after printing the error for a checkout without ``tests/``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("checkout", help=checkout)
    parser.add_argument("--daisy-python", help=daisy)
    parser.add_argument("--nb-python", default=sys.executable, help=nb)
    parser.add_argument(
        "--timeout", type=int, default=timeout, help=f"pytest-timeout per test, seconds (default {timeout})"
    )
    parser.add_argument("--log-dir", help=log_dir)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        return args, extra, find_root(args.checkout)
    except ValueError as e:
        print(e, file=sys.stderr)
        return None


def main(argv=None) -> int:
    parsed = parse_suite_args(
        argv,
        __doc__.split("\n\n")[0],
        checkout="a checkout of funkelab/daisy (branch v2.0), or its tests/ directory",
        daisy="a Python with PyPI daisy==2.0.0 (the reference side)",
        nb="a Python with daisy_nb (default: this one)",
        timeout=120,
        log_dir="keep each side's full pytest output in this directory",
    )
    if parsed is None:
        return 2
    args, extra, root = parsed
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    pa = pytest_args(root, args.timeout, extra)
    print(f"daisy suite: {root}/tests (left out: {', '.join(PRIVATE_FILES)}); load {os.getloadavg()[0]:.2f}")

    sides = {}
    if args.daisy_python:
        log = os.path.join(args.log_dir, "daisy2.txt") if args.log_dir else None
        sides["daisy 2.0.0"] = run_suite([args.daisy_python, "-m", "pytest", *pa], root, log)
    log = os.path.join(args.log_dir, "daisy_nb.txt") if args.log_dir else None
    sides["daisy_nb"] = run_suite([args.nb_python, "-m", "daisy_nb", "run", "-m", "pytest", *pa], root, log)

    return report(sides)


def report(sides: dict) -> int:
    """Print each side's counts per file and every test whose outcome differs; the exit code.

    ``sides``: {name: run_suite's result}, the reference (if any) first and ``"daisy_nb"`` last.
    """
    names = list(sides)
    for name, (results, tail, secs) in sides.items():
        c = collections.Counter(results.values())
        counts = ", ".join(f"{c[o]} {o.lower()}" for o in ("PASSED", "FAILED", "SKIPPED", "ERROR"))
        print(f"  {name:<12} {tail}  [{secs:.0f} s wall, {len(results)} outcomes: {counts}]")
    if not sides["daisy_nb"][0]:
        print("daisy_nb: no test outcomes were reported (see the line above)", file=sys.stderr)
        return 1

    counts = {n: per_file(sides[n][0]) for n in names}
    files = sorted(set().union(*(c.keys() for c in counts.values())))
    print()
    print("| file | " + " | ".join(f"{n} passed/run" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for f in files:
        cells = []
        for n in names:
            c = counts[n].get(f, collections.Counter())
            cells.append(f"{c['PASSED']}/{sum(c.values())}")
        print(f"| {f} | " + " | ".join(cells) + " |")
    totals = [sum(1 for o in sides[n][0].values() if o == "PASSED") for n in names]
    print("| **total passed** | " + " | ".join(str(t) for t in totals) + " |")

    nb = sides["daisy_nb"][0]
    if len(names) == 1:
        bad = sorted(t for t, o in nb.items() if o in ("FAILED", "ERROR"))
        print(f"\ndaisy_nb: {len(bad)} failed or errored")
        for t in bad:
            print(f"  {t}")
        return 1 if bad else 0

    ref = sides[names[0]][0]
    differ = sorted(t for t in set(ref) | set(nb) if ref.get(t) != nb.get(t))
    print(f"\ntests whose outcome differs: {len(differ)}")
    for t in differ:
        print(f"  {t}: daisy 2.0.0 {ref.get(t, 'not run')}, daisy_nb {nb.get(t, 'not run')}")
    regressions = [t for t in differ if ref.get(t) == "PASSED"]
    print(f"passed on daisy 2.0.0 but not on daisy_nb: {len(regressions)}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())

"""The test suite (or a subset) with CPU hogs running beside it: what a shared machine does to it.

    python benchmarks/run_suite_under_load.py                       # fast subset, 2 hogs
    python benchmarks/run_suite_under_load.py --hogs 2 -- -m mp tests/test_hang.py
    python benchmarks/run_suite_under_load.py -- -x               # the whole suite, stop at the first failure

Starts ``--hogs`` processes running ``while True: pass`` (two on a 2-core machine: every
test then shares its cores with a busy neighbour), runs pytest with the given arguments
(default ``-m "not mp and not slow"``) and reports the tests that failed or errored, with
the first line of each failure, from pytest's JUnit XML. The hogs are ended when pytest
ends, however it ends (their process ids, SIGKILL). Exit code: pytest's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOG = "while True: pass"


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(n)
    ]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + 10
    for p in hogs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"run_suite_under_load: hog {p.pid} did not end", file=sys.stderr)


def failures(junit_xml: str) -> list[tuple[str, str, str]]:
    """``(test id, "failed" | "error", first line of the message)`` of every failed or erroring test."""
    try:
        tree = ET.parse(junit_xml)
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in tree.iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                msg = (el.get("message") or el.text or "").strip().splitlines()
                out.append((name, "failed" if kind == "failure" else "error", msg[0][:200] if msg else ""))
    return out


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=2, help="busy processes beside the tests (default 2)")
    ap.add_argument("pytest_args", nargs="*", help='pytest arguments after "--" (default: -m "not mp and not slow")')
    args = ap.parse_args(argv)
    pytest_args = args.pytest_args or ["-m", "not mp and not slow"]
    with tempfile.TemporaryDirectory(prefix="suite_under_load.") as d:
        xml = os.path.join(d, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *pytest_args]
        hogs = start_hogs(args.hogs)
        for p in hogs:
            print(f"hog pid {p.pid}", flush=True)
        old = signal.signal(signal.SIGTERM, _interrupt)  # a killed run still ends its hogs
        t0 = time.monotonic()
        try:
            rc = subprocess.call(cmd, cwd=ROOT)
        except KeyboardInterrupt:
            rc = 130
        finally:
            stop_hogs(hogs)
            signal.signal(signal.SIGTERM, old)
        secs = time.monotonic() - t0
        bad = failures(xml)
        reported = os.path.exists(xml)
    print(f"\nrun_suite_under_load: {args.hogs} hog(s), pytest {' '.join(pytest_args)}: exit {rc}, {secs:.0f} s")
    if not reported:
        print("pytest ended without its report (interrupted?): failures unknown; see its output above")
    elif bad:
        print(f"{len(bad)} test(s) failed under load:")
        for name, kind, msg in bad:
            print(f"  {kind}: {name}\n      {msg}")
    else:
        print("no test failed under load")
    return rc


if __name__ == "__main__":
    sys.exit(main())

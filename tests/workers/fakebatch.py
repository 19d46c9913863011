"""Fake SLURM/LSF commands for tests/test_launch.py: ``fakebatch.py <role> args...``.

The tests put ``sbatch``, ``scancel``, ``bsub`` and ``bkill`` wrappers on ``PATH`` that
run this file with their role. Jobs run on this machine, each under a *runner* in
its own session (as a job on another node: no signal of the driver or the worker
function reaches it), after a queue delay (``FAKEBATCH_QUEUE_SECS``). The state dir
(``FAKEBATCH_DIR``) holds per job id: ``<id>.runner`` (the runner's pid),
``<id>.started``, ``<id>.rc`` (the job's exit status) and ``<id>.cancelled``.

* ``sbatch [--parsable] [--wait] [opts] --wrap CMD``: prints the id (``--parsable``)
  or ``Submitted batch job <id>``; with ``--wait`` waits for the job and exits with
  its status. Like the real one, an interrupted ``sbatch --wait`` (SIGINT, SIGTERM)
  just exits: it does not cancel its job.
* ``bsub -K [-q Q] [-gpu G] [opts] CMD...``: ``Job <id> is submitted to queue <Q>.``,
  waits (``-K``) and exits with the job's status.
* ``scancel ID`` / ``bkill ID``: kill the job's runner and everything in its session
  (a pending job never starts), mark it cancelled; a job that has ended is refused with
  the real commands' message and status 1. Either way ``<id>.cancel_asked`` records the call. ``FAKEBATCH_WAIT_LAG_SECS``: how long a
  waiting ``sbatch``/``bsub`` takes to notice that its job ended (the real ones poll).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

STATE = os.environ.get("FAKEBATCH_DIR", "")


def _path(jid: str, what: str) -> str:
    return os.path.join(STATE, f"{jid}.{what}")


def _new_id() -> str:
    n = 1000
    while True:
        try:
            fd = os.open(_path(str(n), "id"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            return str(n)
        except FileExistsError:
            n += 1


def _submit(argv: list[str]) -> str:
    jid = _new_id()
    runner = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "run", jid, *argv],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    with open(_path(jid, "runner.tmp"), "w") as f:
        f.write(str(runner.pid))
    os.replace(_path(jid, "runner.tmp"), _path(jid, "runner"))
    return jid


def _wait(jid: str) -> int:
    while True:
        try:
            with open(_path(jid, "rc")) as f:
                rc = int(f.read())
            time.sleep(float(os.environ.get("FAKEBATCH_WAIT_LAG_SECS", "0")))  # sbatch --wait polls the job's state
            return rc
        except (FileNotFoundError, ValueError):
            pass
        if os.path.exists(_path(jid, "cancelled")):
            return 1
        time.sleep(0.05)


def run(jid: str, argv: list[str]) -> int:
    """The runner: the queue delay, then the job (its own process, in this session)."""
    time.sleep(float(os.environ.get("FAKEBATCH_QUEUE_SECS", "0")))
    open(_path(jid, "started"), "w").close()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    rc = p.wait()
    with open(_path(jid, "rc.tmp"), "w") as f:
        f.write(str(rc))
    os.replace(_path(jid, "rc.tmp"), _path(jid, "rc"))
    return 0


def sbatch(args: list[str]) -> int:
    wrap = args[args.index("--wrap") + 1]
    jid = _submit(["/bin/sh", "-c", wrap])
    print(jid if "--parsable" in args else f"Submitted batch job {jid}", flush=True)
    return _wait(jid) if "--wait" in args else 0


def bsub(args: list[str]) -> int:
    with_value = {"-q", "-gpu", "-n", "-W", "-R", "-o", "-e", "-J", "-M"}
    i, queue = 0, "normal"
    while i < len(args) and args[i].startswith("-"):
        if args[i] in with_value:
            if args[i] == "-q":
                queue = args[i + 1]
            i += 2
        else:
            i += 1
    jid = _submit(args[i:])
    print(f"Job <{jid}> is submitted to queue <{queue}>.", flush=True)
    if "-K" not in args[:i]:
        return 0
    print("<<Waiting for dispatch ...>>", flush=True)
    return _wait(jid)


def cancel(jid: str, role: str) -> int:
    open(_path(jid, "cancel_asked"), "w").close()
    if os.path.exists(_path(jid, "rc")):  # the job has ended: what the real commands say, and their status
        if role == "scancel":
            print(
                f"scancel: error: Kill job error on job id {jid}: Job/step already completing or completed",
                file=sys.stderr,
            )
        else:
            print(f"Job <{jid}>: Job has already finished", file=sys.stderr)
        return 1
    try:
        with open(_path(jid, "runner")) as f:
            pid = int(f.read())
    except FileNotFoundError:
        print(f"no such job {jid}", file=sys.stderr)
        return 1
    open(_path(jid, "cancelled"), "w").close()
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


def main() -> int:
    role, args = sys.argv[1], sys.argv[2:]
    if role == "run":
        return run(args[0], args[1:])
    if role == "sbatch":
        return sbatch(args)
    if role == "bsub":
        return bsub(args)
    if role in ("scancel", "bkill"):
        return cancel(args[0], role)
    raise SystemExit(f"fakebatch: unknown role {role}")


if __name__ == "__main__":
    sys.exit(main())

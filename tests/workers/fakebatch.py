"""Fake SLURM/LSF commands for tests/test_launch.py: ``fakebatch.py <role> args...``.

The tests put ``sbatch``, ``scancel``, ``sacct``, ``scontrol``, ``bsub``, ``bkill`` and
``bjobs`` wrappers on ``PATH`` that run this file with their role. Jobs run on this
machine, each under a *runner* in its own session (as a job on another node: no signal
of the driver or the worker function reaches it), after a queue delay
(``FAKEBATCH_QUEUE_SECS``), with ``SLURM_JOB_ID``/``LSB_JOBID`` set, and
``SLURM_JOB_END_TIME`` (when its walltime ends, whole UNIX seconds) for a job with a walltime. The state dir
(``FAKEBATCH_DIR``) holds per job id: ``<id>.runner`` (the runner's pid),
``<id>.started``, ``<id>.rc`` (the job's exit status), ``<id>.cancelled``,
``<id>.state`` (how it ended, when not by its own exit: ``TIMEOUT``, ``OUT_OF_MEMORY``,
``PREEMPTED``, ``NODE_FAIL``), ``<id>.reqmem`` (``--mem``/``-M``) and ``<id>.maxrss``.

Why a job ended, as the batch system tells it:

* walltime: ``sbatch --time=[[D-]HH:]MM[:SS]`` (``0:02``: 2 s), ``bsub -W [HH:]MM``, or
  ``FAKEBATCH_WALLTIME_SECS`` for every job: the runner sends the job ``SIGTERM`` (then
  ``SIGKILL``) and marks it ``TIMEOUT``;
* memory: a job "dies of memory" by writing its peak use to
  ``$FAKEBATCH_DIR/<its id>.maxrss`` (``16582348K``, as sacct's MaxRSS) and exiting 137
  (as the OOM killer's ``SIGKILL``): ``OUT_OF_MEMORY``;
* ``fakebatch.py end ID STATE``: the job is killed as a preemption (``PREEMPTED``) or a
  lost node (``NODE_FAIL``) would;
* otherwise ``COMPLETED`` (exit 0), ``FAILED`` (its exit code) or ``CANCELLED``.

* ``sacct -j ID --noheader --parsable2 -o State,ExitCode,MaxRSS,ReqMem``: the
  allocation's line, then the ``batch`` and ``extern`` steps'; ``FAKEBATCH_SACCT=off``:
  accounting disabled (an error, status 1), ``empty``: nothing recorded yet.
* ``scontrol show job ID``: ``JobState=``, ``Reason=``, ``ExitCode=``, ``ReqTRES=``.
* ``bjobs -l ID``: ``Exited with exit code N.``, the ``TERM_*`` exit reason, ``MAX MEM``
  and ``MEMLIMIT``.
* ``FAKEBATCH_QUERY_HANG=1``: ``sacct``, ``scontrol`` and ``bjobs`` hang (a slow controller).

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


def _write(jid: str, what: str, text: str) -> None:
    with open(_path(jid, what + ".tmp"), "w") as f:
        f.write(text)
    os.replace(_path(jid, what + ".tmp"), _path(jid, what))


def _read(jid: str, what: str) -> str | None:
    try:
        with open(_path(jid, what)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _slurm_time(text: str) -> float:
    """``--time``: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]`` in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [float(x) for x in rest.split(":")]
    if days:
        parts += [0.0] * (3 - len(parts))
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 1:
        secs = parts[0] * 60
    elif len(parts) == 2:
        secs = parts[0] * 60 + parts[1]
    else:
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return secs + float(days or 0) * 86400


def _submit(argv: list[str], walltime: float | None = None, reqmem: str | None = None) -> str:
    jid = _new_id()
    if os.environ.get("FAKEBATCH_WALLTIME_SECS"):
        walltime = float(os.environ["FAKEBATCH_WALLTIME_SECS"])
    if walltime is not None:
        _write(jid, "walltime", str(walltime))
    if reqmem is not None:
        _write(jid, "reqmem", reqmem)
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
    """The runner: the queue delay, then the job (its own process, in this session), ended at
    its walltime (``SIGTERM`` to the session but the runner, ``SIGKILL`` 2 s later)."""
    time.sleep(float(os.environ.get("FAKEBATCH_QUEUE_SECS", "0")))
    open(_path(jid, "started"), "w").close()
    walltime = _read(jid, "walltime")
    env = {**os.environ, "SLURM_JOB_ID": jid, "LSB_JOBID": jid}
    env.pop("SLURM_JOB_END_TIME", None)
    if walltime is not None:  # as SLURM: the job's projected end, in whole seconds
        env["SLURM_JOB_END_TIME"] = str(int(time.time() + float(walltime)))
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env)
    try:
        rc = p.wait(timeout=None if walltime is None else float(walltime))
    except subprocess.TimeoutExpired:
        _write(jid, "state", "TIMEOUT")
        signal.signal(signal.SIGTERM, lambda *_: None)  # the runner outlives its SIGTERM (the job: default)
        os.killpg(0, signal.SIGTERM)
        try:
            rc = p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            _write(jid, "rc", str(128 + signal.SIGKILL))
            os.killpg(0, signal.SIGKILL)
    if rc < 0:
        rc = 128 - rc  # as a shell reports a signal
    if rc == 128 + signal.SIGKILL and _read(jid, "maxrss") is not None and _read(jid, "state") is None:
        _write(jid, "state", "OUT_OF_MEMORY")
    _write(jid, "rc", str(rc))
    return 0


def _option(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in ``args`` (sbatch's options)."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def sbatch(args: list[str]) -> int:
    wrap = args[args.index("--wrap") + 1]
    opts = args[: args.index("--wrap")]
    walltime = _option(opts, "--time")
    wt = None if walltime is None else _slurm_time(walltime)
    jid = _submit(["/bin/sh", "-c", wrap], wt, _option(opts, "--mem"))
    print(jid if "--parsable" in args else f"Submitted batch job {jid}", flush=True)
    return _wait(jid) if "--wait" in args else 0


def bsub(args: list[str]) -> int:
    with_value = {"-q", "-gpu", "-n", "-W", "-R", "-o", "-e", "-J", "-M"}
    i, queue, walltime, reqmem = 0, "normal", None, None
    while i < len(args) and args[i].startswith("-"):
        if args[i] in with_value:
            if args[i] == "-q":
                queue = args[i + 1]
            elif args[i] == "-W":  # [HH:]MM
                h, _, m = args[i + 1].rpartition(":")
                walltime = float(h or 0) * 3600 + float(m) * 60
            elif args[i] == "-M":
                reqmem = args[i + 1]
            i += 2
        else:
            i += 1
    jid = _submit(args[i:], walltime, reqmem)
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


def end(jid: str, state: str) -> int:
    """End a running job as the batch system would for ``state`` (``PREEMPTED``, ``NODE_FAIL``)."""
    with open(_path(jid, "runner")) as f:
        pid = int(f.read())
    _write(jid, "state", state)
    _write(jid, "rc", str(128 + signal.SIGKILL))
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


def _state(jid: str) -> tuple[str, int] | None:
    """The job's state as the batch system records it, and its exit status (None: no such job)."""
    if _read(jid, "id") is None:
        return None
    rc = _read(jid, "rc")
    state = _read(jid, "state")
    if state is not None:
        return state, int(rc or 128 + signal.SIGKILL)
    if rc is not None:
        return ("COMPLETED" if rc == "0" else "FAILED"), int(rc)
    if _read(jid, "cancelled") is not None:
        return f"CANCELLED by {os.getuid()}", 128 + signal.SIGKILL
    return ("RUNNING" if _read(jid, "started") is not None else "PENDING"), 0


def _exit_code(rc: int) -> str:
    """SLURM's ``ExitCode``: ``<exit code>:<signal>``."""
    return f"0:{rc - 128}" if rc > 128 else f"{rc}:0"


def _hang() -> None:
    if os.environ.get("FAKEBATCH_QUERY_HANG"):
        time.sleep(600)


def sacct(args: list[str]) -> int:
    _hang()
    if os.environ.get("FAKEBATCH_SACCT") == "off":
        print("sacct: error: Slurm accounting storage is disabled", file=sys.stderr)
        return 1
    assert args[args.index("-o") + 1] == "State,ExitCode,MaxRSS,ReqMem", args
    jid = args[args.index("-j") + 1]
    st = _state(jid)
    if st is None or os.environ.get("FAKEBATCH_SACCT") == "empty":
        return 0
    state, rc = st
    step = "CANCELLED" if state == "TIMEOUT" else state.split()[0]
    code = _exit_code(rc)
    print(f"{state}|{code}||{_read(jid, 'reqmem') or ''}")
    if state not in ("PENDING", f"CANCELLED by {os.getuid()}") or _read(jid, "started") is not None:
        print(f"{step}|{code}|{_read(jid, 'maxrss') or '0'}|")
        print("COMPLETED|0:0|0|")
    return 0


def scontrol(args: list[str]) -> int:
    _hang()
    assert args[:2] == ["show", "job"], args
    st = _state(args[2])
    if st is None:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    state, rc = st
    reason = {"TIMEOUT": "TimeLimit", "OUT_OF_MEMORY": "OutOfMemory", "FAILED": "NonZeroExitCode"}.get(state, "None")
    mem = _read(args[2], "reqmem")
    print(f"JobId={args[2]} JobName=wrap")
    print(f"   JobState={state.split()[0]} Reason={reason} Dependency=(null)")
    print(f"   ExitCode={_exit_code(rc)}")
    print(f"   ReqTRES=cpu=1{',mem=' + mem if mem else ''},node=1,billing=1")
    return 0


_TERM = {
    "TIMEOUT": "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
    "OUT_OF_MEMORY": "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
    "PREEMPTED": "TERM_PREEMPT: job killed after preemption.",
    "CANCELLED": "TERM_OWNER: job killed by owner.",
}


def bjobs(args: list[str]) -> int:
    _hang()
    jid = args[args.index("-l") + 1]
    st = _state(jid)
    if st is None:
        print(f"Job <{jid}> is not found", file=sys.stderr)
        return 255
    state, rc = st
    status = {"COMPLETED": "DONE", "RUNNING": "RUN", "PENDING": "PEND"}.get(state, "EXIT")
    # the first line wrapped as bjobs -l wraps it: continued on a line indented by 21 spaces
    print(f"Job <{jid}>, Job Name <job>, User <me>, Project <default>, Status <{status}>, Queue <n")
    print("                     ormal>, Command <job>")
    if status == "EXIT":
        print(f" Exited with exit code {rc}. The CPU time used is 1.0 seconds.")
        term = _TERM.get(state.split()[0])
        if term:
            print(f" {term}")
    maxrss = _read(jid, "maxrss")
    if maxrss:
        kib = float(maxrss.rstrip("K"))
        print(f" MAX MEM: {kib / 1024**2:.1f} Gbytes;  AVG MEM: 1 Gbytes")
    mem = _read(jid, "reqmem")
    if mem:
        print(" MEMLIMIT")
        print(f"      {mem.rstrip('GB')} G ")
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
    if role == "end":
        return end(args[0], args[1])
    if role in ("sacct", "scontrol", "bjobs"):
        return {"sacct": sacct, "scontrol": scontrol, "bjobs": bjobs}[role](args)
    raise SystemExit(f"fakebatch: unknown role {role}")


if __name__ == "__main__":
    sys.exit(main())

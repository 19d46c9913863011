"""Worker functions that launch a job and never leak it: SLURM, LSF, a local process.

A 0-argument worker function starts a program that runs a ``daisy_nb.Client`` loop
somewhere (another node) and waits for it; daisy calls it once per worker. The
factories here build such worker functions::

    task = daisy.Task(..., process_function=daisy_nb.launch.slurm(
        ["python", "worker.py"], partition="gpu", gpus=1, args=["--mem=16G"]))

* :func:`slurm`: ``sbatch --parsable --wait ... --wrap '<command>'``; the job id is
  the first line ``sbatch`` prints; the job is cancelled with ``scancel <id>``.
* :func:`lsf`: ``bsub -K ... <command>``; the id is read off ``Job <id> is submitted``;
  cancelled with ``bkill <id>``.
* :func:`local`: the command as a child process (its "job id" is its pid), in the
  worker function's process group; ended with ``SIGTERM``, then ``SIGKILL``.

Each returns a picklable 0-argument callable for ``Task(process_function=...)``.
Called, it submits the job, records its id (``.job_id``; a line in the worker's
``.err`` log; a report to the pool: the driver's log, ``on_worker_job`` of the
progress observer (the JSON observer writes a ``job`` line), the dashboard's worker
list), waits for the job and returns as ``subprocess.run(check=True)`` would: a
``CompletedProcess``, or ``CalledProcessError`` when the job (``sbatch --wait``'s and
``bsub -K``'s exit status) failed.

**Why a job died.** When a SLURM or LSF job fails, the launcher asks the batch system
why (``sacct``, else ``scontrol show job``; ``bjobs -l``; at most
``CAUSE_TIMEOUT_SECS`` each) and says it: the exception is a :class:`JobFailed` (a
``CalledProcessError``) whose ``.cause`` is a :class:`Cause` (``TIMEOUT``,
``OUT_OF_MEMORY``, ``PREEMPTED``, ``NODE_FAIL``, ``CANCELLED``, ``FAILED``), its message
``SLURM job 1234 ended: OUT_OF_MEMORY (used 15.8 GiB of 16 GiB requested)``; the job
report carries it (``cause``), so the ``.err`` log line, the JSON observer's ``job``
line and the dashboard's worker list show it. A query that fails or finds nothing adds
nothing (``.cause`` is None). See docs/how-to/ctrl-c-and-jobs.md.

**Never leaked.** ``sbatch --wait`` does not cancel its job when it is interrupted,
so the launcher does: when the worker function is ended — the run is over (Ctrl-C,
abandonment, an exception), the worker is restarted, or the driver is killed (the
pool ends worker functions with ``SIGTERM`` and a grace of
``runtime.local.ending.TERM_GRACE_SECS`` before ``SIGKILL``, and ``SIGTERM`` is their
death signal too) — it cancels the job (``scancel``/``bkill``, also while it still
waits in the queue: a pending job never starts after the run) and ends the submit
command. The job's own ``Client`` also ends its program when the run ends (see
``daisy_nb.runtime.client``), so a job whose cancellation failed still stops within
seconds. Signals are handled only when the worker function runs in the main thread
(as in the pool's worker processes).

Standard library only: worker programs and worker-function processes import it.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

__all__ = ["CAUSES", "Cause", "Ended", "JobFailed", "Launcher", "job_cause", "local", "lsf", "slurm"]

CANCEL_TIMEOUT_SECS = 2.0  # scancel/bkill, within the pool's SIGTERM grace
CAUSE_TIMEOUT_SECS = 5.0  # each query of why a job failed (sacct, scontrol, bjobs): never hang on it
ID_WAIT_SECS = 1.0  # interrupted before the id was read: how long to wait for the submit command to print it
_LSF_ID = re.compile(rb"Job <(\d+)>")
# what scancel / bkill say of a job that has already ended (at a normal end of the run the job's
# worker program has exited but ``sbatch --wait`` polls the job's state and may not have noticed):
# nothing was left to cancel, which is not a failure
_ALREADY_ENDED = re.compile(
    rb"already completing or completed|has already finished|already (?:finished|completed)", re.I
)


# the causes a failed job is reported with (Cause.kind)
TIMEOUT, OUT_OF_MEMORY, PREEMPTED, NODE_FAIL, CANCELLED, FAILED = (
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "NODE_FAIL",
    "CANCELLED",
    "FAILED",
)
CAUSES = (TIMEOUT, OUT_OF_MEMORY, PREEMPTED, NODE_FAIL, CANCELLED, FAILED)
_SCHEDULER_NAMES = {"slurm": "SLURM", "lsf": "LSF", "local": "local"}


class Cause(NamedTuple):
    """Why a batch job failed: ``kind`` (one of :data:`CAUSES`) and a detail for people
    (``"used 15.8 GiB of 16 GiB requested"``, ``"exit code 3"``; may be empty)."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


class JobFailed(subprocess.CalledProcessError):
    """A launcher's job failed: a ``CalledProcessError`` (``returncode``: the submit command's
    exit status) that also says which job (``scheduler``, ``job_id``) and, when the batch system
    could tell, why (``cause``: a :class:`Cause`, else None)."""

    def __init__(self, returncode: int, cmd, scheduler: str, job_id: str | None, cause: Cause | None = None):
        super().__init__(returncode, cmd)
        self.scheduler = scheduler
        self.job_id = job_id
        self.cause = cause

    def __reduce__(self):  # the exception's args are only (returncode, cmd): keep the rest when pickled
        return (type(self), (self.returncode, self.cmd, self.scheduler, self.job_id, self.cause))

    def __str__(self) -> str:
        if self.cause is None:
            return super().__str__()
        name = _SCHEDULER_NAMES.get(self.scheduler, self.scheduler)
        return f"{name} job {self.job_id} ended: {self.cause}; {self.cmd[0]} exited with status {self.returncode}"


class Ended(BaseException):
    """The worker function was ended (``SIGTERM``: the run is over); its job was cancelled."""


def _raise_ended(signum, frame):
    raise Ended(f"ended by signal {signum} (the daisy run is over)")


def _strings(value, name: str, allow_str: bool) -> list[str]:
    if isinstance(value, str):
        if not allow_str:
            raise TypeError(f"{name} must be a list of strings, got a string: {value!r}")
        value = shlex.split(value)
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of strings, got {type(value).__name__}")
    out = list(value)
    for x in out:
        if not isinstance(x, (str, os.PathLike)):
            raise TypeError(f"{name} must be a list of strings, got an item of type {type(x).__name__}")
    return [os.fspath(x) for x in out]


def _env(env) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of strings, got {type(env).__name__}")
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"env must map strings to strings, got {k!r}: {v!r}")
    return dict(env)


class Launcher:
    """A worker function that submits one job and waits for it (built by :func:`slurm`, :func:`lsf`,
    :func:`local`). ``scheduler``: ``"slurm"``, ``"lsf"`` or ``"local"``; ``submit``: the argv that
    submits and waits; ``cancel``: the argv prefix that cancels a job id (None: signal the process)."""

    def __init__(self, scheduler: str, submit: list[str], cancel: list[str] | None, command: list[str], env=None):
        self.scheduler = scheduler
        self.submit = list(submit)
        self.cancel = None if cancel is None else list(cancel)
        self.command = list(command)
        self.env = env
        self.job_id: str | None = None
        self._submit_told = False  # the "submitted" report went out (a SIGTERM may land before it)

    def __repr__(self) -> str:
        return f"daisy_nb.launch.{self.scheduler}({shlex.join(self.command)!r})"

    # --------------------------------------------------------------- reports
    def _report(self, state: str, cause: Cause | None = None) -> None:
        why = "" if cause is None else f": {cause}"
        sys.stderr.write(f"daisy_nb.launch: {self.scheduler} job {self.job_id} {state}{why}\n")
        sys.stderr.flush()
        from daisy_nb.runtime.common.worker_state import report_job

        info = {"scheduler": self.scheduler, "job": self.job_id, "state": state}
        if cause is not None:
            info["cause"] = str(cause)
        report_job(info)

    # ------------------------------------------------------------------ run
    def __call__(self):
        self.job_id = None
        self._submit_told = False
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            old_term = signal.signal(signal.SIGTERM, _raise_ended)
            old_int = signal.getsignal(signal.SIGINT)
        proc = None
        buf = bytearray()
        rc = None  # the submit command's exit status, once it has ended by itself
        try:
            env = None if self.env is None else {**os.environ, **self.env}
            local = self.scheduler == "local"
            proc = subprocess.Popen(
                self.submit, stdin=subprocess.DEVNULL, stdout=None if local else subprocess.PIPE, env=env
            )
            if local:
                self.job_id = str(proc.pid)
                self._report("running")
            else:
                fd = proc.stdout.fileno()
                while True:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    self._on_output(buf, data)
            rc = proc.wait()
            if rc < 0 and not local:  # the submit command was killed: its job may well run on
                why, rc = f"{self.submit[0]} ended by signal {-rc}", None
                raise Ended(why)
            if self.job_id is None:
                self.job_id = "?"
            if rc:
                cause = job_cause(self.scheduler, self.job_id, env)
                self._report(f"failed (exit status {rc})", cause)
                raise JobFailed(rc, self.submit, self.scheduler, self.job_id, cause)
            self._report("done")
        except subprocess.CalledProcessError:
            raise
        except BaseException:
            if rc is None:  # the job may still be queued or running (else: it has ended, nothing to cancel)
                if in_main:  # a second SIGTERM (the death signal after the pool's) must not stop the cancel
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                self._end(proc, buf)
            raise
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
                signal.signal(signal.SIGINT, old_int if old_int is not None else signal.SIG_DFL)
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
        return subprocess.CompletedProcess(self.submit, 0)

    def _on_output(self, buf: bytearray, data: bytes) -> None:
        """The submit command's stdout: find the job id, pass the rest on to this worker's stdout."""
        if self.job_id is not None:
            self._echo(data)
            return
        buf += data
        while self.job_id is None and b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            self._parse(line)
            if self.job_id is None:
                self._echo(line + b"\n")
        if self.job_id is not None:
            self._report("submitted")
            self._submit_told = True
            if buf:
                self._echo(bytes(buf))
                buf.clear()

    def _parse(self, line: bytes) -> None:
        if self.scheduler == "slurm":  # --parsable: "<id>" or "<id>;<cluster>"
            head = line.strip().split(b";")[0].decode("ascii", "replace")
            if head.isdigit() or re.fullmatch(r"\d+_\d+", head):
                self.job_id = head
        else:
            m = _LSF_ID.search(line)
            if m:
                self.job_id = m.group(1).decode()

    @staticmethod
    def _echo(data: bytes) -> None:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        except (AttributeError, OSError, ValueError):
            pass

    # --------------------------------------------------------------- cancel
    def _end(self, proc, buf: bytearray) -> None:
        """The worker function is ended: cancel the job (also a pending one), end the submit command."""
        if proc is None:
            return
        if self.scheduler == "local":
            self._stop(proc)
            self._report("cancelled")
            return
        if self.job_id is None:  # interrupted while submitting: the id may be printed (or in the pipe) still
            deadline = time.monotonic() + ID_WAIT_SECS
            fd = proc.stdout.fileno()
            while self.job_id is None and time.monotonic() < deadline:
                r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                if not r:
                    break
                data = os.read(fd, 65536)
                if not data:
                    break
                self._on_output(buf, data)
            if self.job_id is None and buf:
                self._parse(bytes(buf))
        if self.job_id is None:
            sys.stderr.write(f"daisy_nb.launch: {self.scheduler}: ended before the job id was known\n")
            self._stop(proc)
            return
        if not self._submit_told:  # ended between reading the id and reporting it: every job is reported
            self._report("submitted")
            self._submit_told = True
        try:
            r = subprocess.run(
                [*self.cancel, self.job_id],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CANCEL_TIMEOUT_SECS,
            )
            if _ALREADY_ENDED.search(r.stderr + r.stdout):
                state = "ended before the cancel"
            elif r.returncode == 0:
                state = "cancelled"
            else:
                state = f"cancel failed: {r.stderr.decode(errors='replace').strip()}"
        except (OSError, subprocess.TimeoutExpired) as e:
            state = f"cancel failed: {e}"
        self._stop(proc)
        self._report(state)

    @staticmethod
    def _stop(proc) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------ why a job failed
_SLURM_CAUSES = {
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "PREEMPTED": PREEMPTED,
    "NODE_FAIL": NODE_FAIL,
    "BOOT_FAIL": NODE_FAIL,
    "CANCELLED": CANCELLED,
    "FAILED": FAILED,
}
# LSF's exit reasons (``bjobs -l``: "TERM_RUNLIMIT: job killed after reaching LSF run time limit")
_LSF_CAUSES = {
    "TERM_RUNLIMIT": TIMEOUT,
    "TERM_DEADLINE": TIMEOUT,
    "TERM_MEMLIMIT": OUT_OF_MEMORY,
    "TERM_SWAP": OUT_OF_MEMORY,
    "TERM_PREEMPT": PREEMPTED,
    "TERM_OWNER": CANCELLED,
    "TERM_FORCE_OWNER": CANCELLED,
    "TERM_ADMIN": CANCELLED,
    "TERM_FORCE_ADMIN": CANCELLED,
}
_SIZE = re.compile(r"([\d.]+)\s*([KMGTP]?)(?:i?B|bytes)?", re.I)
_UNITS = "KMGTP"


def _bytes(text: str) -> float | None:
    """A size as SLURM (``16582348K``, ``16G``, ``16Gn``, ``4000Mc``) or LSF (``15.8 Gbytes``, ``16 G``)
    write it, in bytes (a bare number: SLURM's MaxRSS bytes; K, M, G are binary units)."""
    m = _SIZE.fullmatch(text.strip().rstrip("nc"))
    if m is None:
        return None
    unit = m.group(2).upper()
    return float(m.group(1)) * (1024 ** (_UNITS.index(unit) + 1) if unit else 1)


def _size(n: float) -> str:
    """``n`` bytes for people: ``15.8 GiB``, ``16 GiB``, ``900 MiB``."""
    unit = "B"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            break
        n, unit = n / 1024, u
    return f"{n:.1f}".rstrip("0").rstrip(".") + f" {unit}"


def _memory(used: float | None, requested: float | None, per_cpu: bool = False) -> str:
    req = None if not requested else _size(requested) + (" per CPU" if per_cpu else "")
    if used and req:
        return f"used {_size(used)} of {req} requested"
    if used:
        return f"used {_size(used)}"
    return f"{req} requested" if req else ""


def _exit_detail(code: str) -> str:
    """SLURM's ``ExitCode`` (``<exit code>:<signal>``) for people."""
    rc, _, sig = code.partition(":")
    if sig.isdigit() and int(sig):
        return f"signal {int(sig)}"
    return f"exit code {int(rc)}" if rc.isdigit() else ""


def _run(argv: list[str], env) -> str | None:
    """What ``argv`` printed, or None if it could not run, failed or took over ``CAUSE_TIMEOUT_SECS``."""
    try:
        r = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=CAUSE_TIMEOUT_SECS, env=env, check=False
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None


def _slurm_state(state: str, code: str, maxrss: float | None, reqmem: str) -> Cause | None:
    kind = _SLURM_CAUSES.get(state.split()[0] if state.strip() else "")  # "CANCELLED by 1234"
    if kind is None:
        return None
    if kind == OUT_OF_MEMORY:
        return Cause(kind, _memory(maxrss, _bytes(reqmem) if reqmem else None, reqmem.endswith("c")))
    if kind == FAILED:
        return Cause(kind, _exit_detail(code))
    return Cause(kind, "walltime" if kind == TIMEOUT else "")


def slurm_cause_from_sacct(text: str) -> Cause | None:
    """Why a SLURM job failed, from ``sacct -j ID --noheader --parsable2 -o State,ExitCode,MaxRSS,ReqMem``:
    the first line is the job's allocation (its state), the others its steps (the largest MaxRSS;
    a step that ran out of memory while the allocation says FAILED, as older SLURM versions write it)."""
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    rows = [r + [""] * (4 - len(r)) for r in rows]
    if not rows:
        return None
    state, code, _, reqmem = rows[0][:4]
    rss = [b for b in (_bytes(r[2]) for r in rows if r[2]) if b is not None]
    if state.startswith("FAILED") and any(r[0].startswith("OUT_OF_MEMORY") for r in rows[1:]):
        state = "OUT_OF_MEMORY"
    return _slurm_state(state, code, max(rss) if rss else None, reqmem or next((r[3] for r in rows if r[3]), ""))


def slurm_cause_from_scontrol(text: str) -> Cause | None:
    """Why a SLURM job failed, from ``scontrol show job ID`` (``JobState=``, ``ExitCode=``, the
    memory of ``ReqTRES=...,mem=16G``; no memory used is known there)."""
    state = re.search(r"\bJobState=(\S+)", text)
    if state is None:
        return None
    code = re.search(r"\bExitCode=(\S+)", text)
    mem = re.search(r"\bReqTRES=\S*?\bmem=([^,\s]+)", text) or re.search(r"\bMinMemoryNode=(\S+)", text)
    return _slurm_state(state.group(1), code.group(1) if code else "", None, mem.group(1) if mem else "")


def lsf_cause_from_bjobs(text: str) -> Cause | None:
    """Why an LSF job failed, from ``bjobs -l ID``: its exit reason (``TERM_RUNLIMIT``,
    ``TERM_MEMLIMIT``, ``TERM_PREEMPT``, ``TERM_OWNER``...), its ``MAX MEM`` and ``MEMLIMIT``,
    else ``Exited with exit code N``."""
    text = re.sub(r"\n {21}", "", text)  # bjobs -l wraps its long lines, indented by 21 spaces
    term = re.search(r"\b(TERM_[A-Z_]+)", text)
    kind = _LSF_CAUSES.get(term.group(1)) if term else None
    if kind == OUT_OF_MEMORY:
        used = re.search(r"MAX MEM:\s*([\d.]+\s*\w+)", text)
        limit = re.search(r"MEMLIMIT\s*\n\s*([\d.]+\s*[KMGTP]?)\b", text)
        return Cause(kind, _memory(_bytes(used.group(1)) if used else None, _bytes(limit.group(1)) if limit else None))
    if kind is not None:
        return Cause(kind, "walltime" if kind == TIMEOUT else "")
    code = re.search(r"Exited with exit code (\d+)", text)
    if code:
        return Cause(FAILED, f"exit code {code.group(1)}")
    return None


def job_cause(scheduler: str, job_id: str | None, env=None) -> Cause | None:
    """Why the batch system says job ``job_id`` failed (None: a local process, or the query failed
    or found nothing). SLURM: ``sacct``, else ``scontrol show job`` (accounting off, or no final
    state recorded yet); LSF: ``bjobs -l``. Each query at most ``CAUSE_TIMEOUT_SECS``; never raises."""
    if not job_id or not job_id.replace("_", "").isdigit():
        return None
    try:
        if scheduler == "slurm":
            out = _run(["sacct", "-j", job_id, "--noheader", "--parsable2", "-o", "State,ExitCode,MaxRSS,ReqMem"], env)
            cause = slurm_cause_from_sacct(out) if out else None
            if cause is None:
                out = _run(["scontrol", "show", "job", job_id], env)
                cause = slurm_cause_from_scontrol(out) if out else None
            return cause
        if scheduler == "lsf":
            out = _run(["bjobs", "-l", job_id], env)
            return lsf_cause_from_bjobs(out) if out else None
    except Exception:  # a parser's surprise must not hide the job's failure itself
        return None
    return None


def _opt(flag: str, value) -> list[str]:
    return [] if value is None else [f"{flag}={value}"]


def slurm(
    command,
    *,
    partition: str | None = None,
    gpus=None,
    time_limit: str | None = None,
    args=(),
    env: dict | None = None,
    sbatch: str = "sbatch",
    scancel: str = "scancel",
) -> Launcher:
    """A worker function that runs ``command`` (a list of strings) as a SLURM job and waits for it.

    ``sbatch --parsable --wait [--partition=..] [--gpus=..] [--time=..] *args --wrap '<command>'``;
    ``env``: variables added to the environment the job inherits (``sbatch`` exports it, with
    ``DAISY_CONTEXT``). The job is cancelled with ``scancel <id>`` when the worker function is ended.
    """
    cmd = _strings(command, "command", allow_str=True)
    if not cmd:
        raise ValueError("command must not be empty")
    submit = [sbatch, "--parsable", "--wait", *_opt("--partition", partition), *_opt("--gpus", gpus)]
    submit += [*_opt("--time", time_limit), *_strings(args, "args", allow_str=False), "--wrap", shlex.join(cmd)]
    return Launcher("slurm", submit, [scancel], cmd, _env(env))


def lsf(
    command,
    *,
    queue: str | None = None,
    gpus=None,
    args=(),
    env: dict | None = None,
    bsub: str = "bsub",
    bkill: str = "bkill",
) -> Launcher:
    """A worker function that runs ``command`` as an LSF job and waits for it (``bsub -K``).

    ``bsub -K [-q queue] [-gpu num=N] *args command...``; the id comes from ``Job <id> is
    submitted``; the job is killed with ``bkill <id>`` when the worker function is ended.
    """
    cmd = _strings(command, "command", allow_str=True)
    if not cmd:
        raise ValueError("command must not be empty")
    submit = [bsub, "-K"]
    if queue is not None:
        submit += ["-q", str(queue)]
    if gpus is not None:
        submit += ["-gpu", f"num={gpus}"]
    submit += [*_strings(args, "args", allow_str=False), *cmd]
    return Launcher("lsf", submit, [bkill], cmd, _env(env))


def local(command, *, env: dict | None = None) -> Launcher:
    """A worker function that runs ``command`` as a child process and waits for it (``SIGTERM`` when ended)."""
    cmd = _strings(command, "command", allow_str=True)
    if not cmd:
        raise ValueError("command must not be empty")
    return Launcher("local", cmd, None, cmd, _env(env))

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

__all__ = ["Ended", "Launcher", "local", "lsf", "slurm"]

CANCEL_TIMEOUT_SECS = 2.0  # scancel/bkill, within the pool's SIGTERM grace
ID_WAIT_SECS = 1.0  # interrupted before the id was read: how long to wait for the submit command to print it
_LSF_ID = re.compile(rb"Job <(\d+)>")
# what scancel / bkill say of a job that has already ended (at a normal end of the run the job's
# worker program has exited but ``sbatch --wait`` polls the job's state and may not have noticed):
# nothing was left to cancel, which is not a failure
_ALREADY_ENDED = re.compile(
    rb"already completing or completed|has already finished|already (?:finished|completed)", re.I
)


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
    def _report(self, state: str) -> None:
        sys.stderr.write(f"daisy_nb.launch: {self.scheduler} job {self.job_id} {state}\n")
        sys.stderr.flush()
        from daisy_nb.runtime.common.worker_state import report_job

        report_job({"scheduler": self.scheduler, "job": self.job_id, "state": state})

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
                self._report(f"failed (exit status {rc})")
                raise subprocess.CalledProcessError(rc, self.submit)
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

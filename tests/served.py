"""Stopping a served process (`daisy-nb dashboard ...`) with Ctrl-C, and saying why when it does not stop.

An offline dashboard ends ~0.3 s after SIGINT. When it does not within the deadline, the failure shows what
the process was doing (every thread's stack, from faulthandler on SIGABRT) and its signal masks, rather than
only a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(
    cmd: list[str], *, cwd: Path, env: dict[str, str], sigint_ignored: bool = False
) -> tuple[subprocess.Popen, Path]:
    """Start `cmd` with stdout piped (read its first line) and stderr to a file (nothing can fill a pipe).

    ``sigint_ignored``: start it as a shell script's background job (`cmd &`) is, SIGINT ignored.
    """
    fd, err = tempfile.mkstemp(prefix="served-", suffix=".stderr", dir=cwd)
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=dict(env, PYTHONFAULTHANDLER="1"),
            stdout=subprocess.PIPE,
            stderr=fd,
            text=True,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )
    finally:
        os.close(fd)
    return proc, Path(err)


def _signal_masks(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return " ".join(line for line in text.splitlines() if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt")))


def stop(proc: subprocess.Popen, err: Path, *, deadline: float = 60.0) -> str:
    """SIGINT, then wait up to `deadline` s for exit code 0; returns the process's stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        masks = _signal_masks(proc.pid)
        proc.send_signal(signal.SIGABRT)  # faulthandler dumps every thread's stack to stderr
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise AssertionError(
            f"not ended {deadline:.0f} s after SIGINT ({masks}); its stderr:\n{err.read_text()[-6000:]}"
        ) from None
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    text = err.read_text()
    assert rc == 0, f"exit code {rc}; stderr:\n{text[-4000:]}"
    return text

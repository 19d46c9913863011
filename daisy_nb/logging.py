"""Per-worker log routing knobs, as in ``daisy.logging`` (daisy 2.0 wheel).

Workers are separate processes, so routing is done at the file-descriptor level:
the pool opens ``<basedir>/<task_id>/worker_<n>.out/.err`` (append mode, one
separator line per run) and hands them to the worker process as its fd 1 and 2.
Everything the worker writes, from Python or from C, lands there.

This module deliberately does not install logging handlers (the wheel's choice:
a handler with ``propagate=False`` hid daisy's records from applications).
All settings are process-global; change them before calling ``run_blockwise``.
"""

from __future__ import annotations

import logging as _py_logging
import os
import sys
import traceback as _py_traceback
from pathlib import Path

__all__ = [
    "LOG_BASEDIR",
    "clear_logs",
    "close_all_log_files",
    "current_slot_files",
    "emit_failure",
    "existing_log_basedir",
    "format_traceback",
    "get_log_basedir",
    "get_log_level",
    "get_log_mode",
    "get_traceback_style",
    "get_worker_log_basename",
    "set_log_basedir",
    "set_log_level",
    "set_log_mode",
    "set_traceback_style",
]

#: The worker log directory. This default object (not an equal path) means that the program
#: has chosen none, so ``DAISY_NB_LOG_DIR`` decides (:func:`get_log_basedir`).
LOG_BASEDIR: Path | None = Path("./daisy_logs")
_DEFAULT_BASEDIR = LOG_BASEDIR
_LOG_MODE = "file"
_VALID_MODES = ("console", "file", "both")
_TRACEBACK_STYLE = "plain"

logger = _py_logging.getLogger("daisy")
_worker_files = None  # (out, err) text files of this worker process's log slot, bound by the worker


def set_log_basedir(path) -> None:
    """Set the directory for per-worker log files; ``None`` disables file logging.

    A directory set here wins over ``DAISY_NB_LOG_DIR``, even ``./daisy_logs``.
    """
    global LOG_BASEDIR
    LOG_BASEDIR = Path(path) if path is not None and str(path) != "" else None


def get_log_basedir() -> Path | None:
    """The per-worker log directory, or ``None`` when file logging is off.

    The directory the program set (:func:`set_log_basedir`, or ``LOG_BASEDIR`` assigned);
    if it set none, ``DAISY_NB_LOG_DIR`` when that is set (read at each call), else
    ``./daisy_logs``.
    """
    if LOG_BASEDIR is _DEFAULT_BASEDIR:
        from daisy_nb import config

        chosen = config.LOG_DIR.get()
        if chosen is not None:
            return Path(chosen)
    return LOG_BASEDIR


def existing_log_basedir() -> str | None:
    """:func:`get_log_basedir` if that directory exists: the default ``--logs`` of the commands
    that read a finished run's worker logs (``daisy-nb status``, ``daisy-nb dashboard``)."""
    base = get_log_basedir()
    return str(base) if base is not None and base.is_dir() else None


def set_log_mode(mode: str) -> None:
    """``"console"``, ``"file"`` (default) or ``"both"``; anything else raises ``ValueError``."""
    global _LOG_MODE
    if mode not in _VALID_MODES:
        raise ValueError(f"mode must be one of {_VALID_MODES!r}, got {mode!r}")
    _LOG_MODE = mode


def get_log_mode() -> str:
    """The effective mode: ``"console"`` whenever the basedir is ``None``."""
    if LOG_BASEDIR is None:
        return "console"
    return _LOG_MODE


def set_log_level(level) -> None:
    """Set the level of the ``"daisy"`` logger."""
    logger.setLevel(level)


def get_log_level() -> int:
    """The level of the ``"daisy"`` logger."""
    return logger.level


def get_worker_log_basename(worker_id: int | str, task_id: str | None = None) -> Path | None:
    """``<basedir>/[task_id/]worker_<worker_id>``, without suffix (``None`` if logging is off).

    Parameters
    ----------
    worker_id : int or str
        The worker's id (``block.worker_id``, ``Context``'s ``worker_id``).
    task_id : str, optional
        The worker's task: its logs are then in a directory of that name.

    Returns
    -------
    pathlib.Path or None
        The path to which ``.out``/``.err`` are appended; None when worker logging is off.
    """
    base = get_log_basedir()
    if base is None:
        return None
    if task_id is not None:
        base = base / str(task_id)
    return base / f"worker_{worker_id}"


def set_traceback_style(style: str, *, show_locals: bool = False, width: int = 100, extra_lines: int = 2) -> None:
    """Choose ``"plain"`` or ``"rich"`` tracebacks (``rich`` is rendered as plain in workers)."""
    global _TRACEBACK_STYLE
    if style not in ("plain", "rich"):
        raise ValueError(f"style must be 'plain' or 'rich', got {style!r}")
    _TRACEBACK_STYLE = style


def get_traceback_style() -> str:
    """The traceback style set by :func:`set_traceback_style`."""
    return _TRACEBACK_STYLE


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def format_traceback(exc_type, exc, tb) -> str:
    """Format an exception, dropping leading daisy_nb frames so it starts at user code."""
    try:
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PKG_DIR):
            tb = tb.tb_next
        return "".join(_py_traceback.format_exception(exc_type, exc, tb))
    except Exception as e:  # a user's exception whose __str__/__repr__ raises: still a report, never a raise
        return f"{getattr(exc_type, '__name__', 'Exception')}: {exc!r}\n(failed to format traceback: {e!r})\n"


def run_separator() -> str:
    """The line written at the start of each run into a non-empty log file."""
    import datetime  # (here, as shutil below: every worker and the worker template import this module)

    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    return f"=== daisy run {stamp} pid {os.getpid()} ===\n"


def open_worker_logs(task_id: str, slot: int):
    """Open (append) the ``.out``/``.err`` files of one worker slot; ``None`` in console mode."""
    if get_log_mode() == "console":
        return None
    base = get_worker_log_basename(slot, task_id)
    if base is None:  # file logging is off
        return None
    base.parent.mkdir(parents=True, exist_ok=True)
    files = []
    for suffix in (".out", ".err"):
        f = open(str(base) + suffix, "ab", buffering=0)
        if f.tell() > 0:
            f.write(run_separator().encode())
        files.append(f)
    return files[0], files[1]


def clear_logs(task_id=None):
    """Delete the log tree of one task (or all); returns the deleted path."""
    base = get_log_basedir()
    if base is None:
        return None
    target = base / task_id if task_id else base
    import shutil

    shutil.rmtree(target, ignore_errors=True)
    return target


def close_all_log_files() -> None:
    """Kept for API compatibility: the pool closes each worker's files itself."""


def _bind_worker_files(out, err) -> None:
    """Called by a worker process whose output goes to its slot's log files."""
    global _worker_files
    _worker_files = (out, err)


def current_slot_files():
    """``(out, err)``: the log files of this worker process's slot, or ``None``.

    ``None`` outside a worker process and when file logging is off. A program that a
    worker function starts inherits the files as its stdout/stderr anyway (a
    worker's file descriptors 1 and 2 are its log files); passing them explicitly
    (``subprocess.run(cmd, stdout=out, stderr=err)``) is what daisy 2.0 asks for.
    """
    return _worker_files


def emit_failure(message: str) -> None:
    """Write a failure message where the log mode sends worker errors.

    In a worker process: its ``.err`` log file (and the console in mode
    ``"both"``), or the console in mode ``"console"``. Elsewhere: the console in
    modes ``"console"`` and ``"both"``, nothing in mode ``"file"``. Never raises.
    """
    if not message.endswith("\n"):
        message += "\n"
    if _worker_files is not None:
        targets = [_worker_files[1]]
        if get_log_mode() == "both":
            targets.append(sys.__stderr__)
    elif get_log_mode() in ("console", "both"):
        targets = [sys.stderr]
    else:
        targets = []
    for t in targets:
        try:
            t.write(message)
            t.flush()
        except (OSError, ValueError):  # a closed or full stream: reporting a failure must not fail
            pass

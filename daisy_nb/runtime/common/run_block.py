"""What a block that ran ends as, seen by every runtime: its status codes and its traceback.

* ``PROCESSING``, ``DONE``, ``FAILED``: block statuses as the Scheduler's release takes them;
* :func:`cap_traceback`: the last 50 lines / 8 KiB of a traceback, the size that
  travels to the scheduler and into the summary (the wheel's cap);
* :func:`exception_message`: an exception's message, capped as a traceback is;
* :func:`format_exception`: an exception formatted as :mod:`daisy_nb.logging`
  formats worker tracebacks (leading daisy_nb frames dropped).

Standard library only: worker processes import this, never numpy or numba.
"""

from __future__ import annotations

__all__ = [
    "DONE",
    "FAILED",
    "TB_CAP_BYTES",
    "TB_CAP_LINES",
    "cap_traceback",
    "exception_message",
    "format_exception",
]

TB_CAP_LINES = 50
TB_CAP_BYTES = 8192

# block statuses as the Scheduler's release takes them (daisy_nb.block.BlockStatus, without importing it)
PROCESSING = 1
DONE = 2
FAILED = 3


TB_TRUNCATED = "... (traceback truncated) ..."


def cap_traceback(tb: str) -> str:
    """The last ``TB_CAP_LINES`` lines of ``tb``, then its last ``TB_CAP_BYTES`` characters; a
    shortened one starts with daisy 2.0.0's ``... (traceback truncated) ...`` line."""
    lines = tb.splitlines()
    cut = len(lines) > TB_CAP_LINES
    if cut:
        tb = "\n".join(lines[-TB_CAP_LINES:])
    if len(tb) > TB_CAP_BYTES:
        tb, cut = tb[-TB_CAP_BYTES:], True
    return f"{TB_TRUNCATED}\n{tb}" if cut else tb


def exception_message(e: BaseException) -> str:
    """``str(e)``, at most ``TB_CAP_BYTES`` characters (``<unprintable ...>`` when its ``__str__`` raises)."""
    try:
        text = str(e)
    except Exception:  # a user's exception whose __str__ raises: its type still says what failed
        text = f"<unprintable {type(e).__name__} object>"
    return text[:TB_CAP_BYTES]


def format_exception(e: BaseException) -> str:
    """``e`` formatted as :mod:`daisy_nb.logging` formats worker tracebacks."""
    from daisy_nb import logging as dlog

    return dlog.format_traceback(type(e), e, e.__traceback__)

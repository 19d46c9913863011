"""Moved to :mod:`daisy_nb.runtime.common.worker_state` (``init_fn`` states, job reports) and
:mod:`daisy_nb.runtime.common.run_block` (calling a block function, tracebacks). Re-exported here
only for the importers that other branches of this change still have. Standard library only.
"""

from __future__ import annotations

from daisy_nb.runtime.common.run_block import (
    TB_CAP_BYTES,
    TB_CAP_LINES,
    TB_TRUNCATED,
    cap_traceback,
    format_exception,
)
from daisy_nb.runtime.common.worker_state import (
    bind,
    bind_report,
    report_job,
    set_worker_state,
    unbind,
    worker_state,
)

__all__ = [
    "TB_CAP_BYTES",
    "TB_CAP_LINES",
    "TB_TRUNCATED",
    "bind",
    "bind_report",
    "cap_traceback",
    "format_exception",
    "report_job",
    "set_worker_state",
    "unbind",
    "worker_state",
]

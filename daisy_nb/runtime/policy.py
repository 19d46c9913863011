"""Moved to :mod:`daisy_nb.runtime.common` (cut by responsibility: ``taskrun``, ``failures``,
``batching``, ``payload``, ``run_end``). Re-exported here only for the importers that other
branches of this change still have; import from ``daisy_nb.runtime.common.*``.
"""

from __future__ import annotations

from daisy_nb.runtime.common.batching import MAX_GROWTH, grow_batch
from daisy_nb.runtime.common.failures import (
    CRASH_SIGNALS,
    JOB_END,
    count_worker_failure,
    is_job_end,
    record_error,
)
from daisy_nb.runtime.common.payload import serialize_function, timeout_of, wants_context
from daisy_nb.runtime.common.run_end import end_run
from daisy_nb.runtime.common.taskrun import TaskRun, elapsed_of

__all__ = [
    "CRASH_SIGNALS",
    "JOB_END",
    "MAX_GROWTH",
    "TaskRun",
    "count_worker_failure",
    "elapsed_of",
    "end_run",
    "grow_batch",
    "is_job_end",
    "record_error",
    "serialize_function",
    "timeout_of",
    "wants_context",
]

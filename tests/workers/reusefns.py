"""Block functions and init_fns for the worker-reuse tests (imported by worker processes: keep light).

Each block appends ``pid task-in-DAISY_CONTEXT`` to ``ran_<task>_<block>`` and prints a line
(the worker's log files); each ``init_fn`` appends ``pid task-in-DAISY_CONTEXT`` to ``inits``.
Files go under ``$DAISY_NB_TEST_OUT``.
"""

import os
import time


def _context_task() -> str:
    from daisy_nb.runtime.context import Context

    return Context.from_env()["task_id"]


def _append(name: str, text: str) -> None:
    with open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], name), "a") as f:
        f.write(text)


def init() -> tuple:
    _append("inits", f"{os.getpid()} {_context_task()}\n")
    return os.getpid(), _context_task()


def record(block) -> None:
    from daisy_nb.runtime.common.worker_state import worker_state

    assert worker_state() == (os.getpid(), block.task_id), "the task's init_fn did not run in this process"
    _append(f"ran_{block.task_id}_{block.spatial_id}", f"{os.getpid()} {_context_task()}\n")
    print(f"hello from {block.task_id} {block.spatial_id}", flush=True)
    time.sleep(0.01)


def record_raise_b1(block) -> None:
    record(block)
    if block.task_id == "b" and block.spatial_id == 1:
        raise ValueError("block b1 fails")


def record_too(block) -> None:
    """``record`` under another name: a task with another block function."""
    record(block)

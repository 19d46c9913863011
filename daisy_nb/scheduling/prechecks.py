"""The tasks' ``check_function`` prechecks: :class:`Prechecks`.

daisy runs a task's ``check_function(block)`` before handing a block out; a block it
says is done is skipped (counted as completed, recorded as done). The user's check
is trusted with nothing: any exception means "not done" (the block runs), and is
logged once per task, on daisy's logger, with the traceback from the user's frame
(as the daisy 2.0 wheel logs it).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from daisy_nb.block import Block

__all__ = ["Prechecks"]

logger = logging.getLogger("daisy")  # the message daisy 2.0.0 logs, on its logger


class Prechecks:
    """Every task's ``check_function`` (``fns``: ``{task_id: function or None}``), and which
    tasks' checks have raised (those are logged once)."""

    def __init__(self, fns: dict[str, Callable[[Block], bool] | None]) -> None:
        self.fns = fns
        self._warned: set[str] = set()

    def done(self, task_id: str, block: Block) -> bool:
        """Whether ``task_id``'s check says ``block`` is done already (False if it raised)."""
        fn = self.fns[task_id]
        assert fn is not None  # called for tasks with a check_function only
        try:
            return bool(fn(block))
        except Exception as e:  # the user's check: any error means "not done", as in daisy
            if task_id not in self._warned:
                self._warned.add(task_id)
                frames = e.__traceback__.tb_next if e.__traceback__ is not None else None  # from the user's frame
                tb = "".join(traceback.format_exception(type(e), e, frames)).rstrip()
                logger.warning(
                    'check_function for task "%s" raised; treating block %s/%s as not done, so it will be '
                    "(re)processed. Further check failures for this task will not be logged:\n%s",
                    task_id, task_id, block.block_id[1], tb,
                )  # fmt: skip
            return False

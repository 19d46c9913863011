"""What every runtime shares (serial runner, worker pool, ``Client`` loops, dask).

One home per concept, cut by responsibility:

* :mod:`.taskrun`: :class:`~.taskrun.TaskRun`, the per-task run record (the ``Task``
  options a runtime uses, read once), and :func:`~.taskrun.nothing_left`. Block
  counts (in flight, abandoned) are the Scheduler's, never copied here;
* :mod:`.failures`: worker failures and abandonment, one policy for every back-end
  (:class:`~.failures.AbandonReason`, :class:`~.failures.TaskAbandonedError`,
  :func:`~.failures.is_job_end`, the restart cap, :func:`~.failures.abandon`);
* :mod:`.batching`: the batch size from the measured time per block;
* :mod:`.payload`: the task's functions as they travel to workers;
* :mod:`.run_end`: the end of every run (resource stats, ``on_finish``, the summary);
* :mod:`.worker_state` and :mod:`.run_block`: the worker side (standard library
  only): ``init_fn`` states, job reports, and the one implementation of calling a
  block function, classifying its status and capping its traceback.

This package's ``__init__`` imports nothing: worker processes import
:mod:`.worker_state` and :mod:`.run_block` and must not load numpy or numba.
"""

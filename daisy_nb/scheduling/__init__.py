"""The parts of :class:`daisy_nb.Scheduler` that decide nothing about blocks (``daisy_nb/scheduler.py``
holds the decisions: hand-out, release, abandonment; and the read-only views observers take,
``SchedulerViews``):

* :mod:`.geometry`: where a pipeline's blocks are (packed tables, rows, ids, ROIs, the task DAG);
* :mod:`.tracking`: the block tracking stores of a pipeline's tasks (done markers on disk);
* :mod:`.pace`: when compiling the kernels pays, from the work expected and the hand-out rate;
* :mod:`.start`: the state before the first hand-out (skip masks flagged, each task's ready blocks);
* :mod:`.prechecks`: the tasks' ``check_function`` calls before a hand-out;
* :mod:`.listed`: the hand-out and release as lists of ints, what the TCP runtime holds and calls.
* :mod:`.backoff`: when a failed block may be retried (``Task(retry_backoff=...)``) and where it
  waits until then; a core without clock or I/O whose answers the Scheduler carries out.
* :mod:`.job_seconds`: what a task's workers cost (worker-seconds held and busy);
* :mod:`.median`: the median of recent block times (without importing :mod:`statistics`);
* :mod:`.speculation`: which straggling blocks get a backup copy and which copy's end counts
  (``Task(speculative=...)``); a core without clock or I/O, carried out by the local pool.

Part of the core: imports nothing from ``daisy_nb.runtime`` or ``daisy_nb.dashboard``.
"""

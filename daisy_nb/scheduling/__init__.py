"""The parts of :class:`daisy_nb.Scheduler` that decide nothing about blocks (``daisy_nb/scheduler.py``
holds the decisions: hand-out, release, prechecks, abandonment):

* :mod:`.geometry`: where a pipeline's blocks are (packed tables, rows, ids, ROIs, the task DAG);
* :mod:`.views`: what observers read of a run (counts, per-row states, task snapshots);
* :mod:`.tracking`: the block tracking stores of a pipeline's tasks (done markers on disk);
* :mod:`.pace`: when compiling the kernels pays, from the work expected and the hand-out rate.
* :mod:`.listed`: the hand-out and release as lists of ints, what the TCP runtime holds and calls.

Part of the core: imports nothing from ``daisy_nb.runtime`` or ``daisy_nb.dashboard``.
"""

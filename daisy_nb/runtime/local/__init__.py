"""The local back-end: worker processes on this machine, fed through shared memory.

Block workers (block functions) get batches of blocks through a shared-memory
segment; their decisions (who gets which batch, prefetch, parking, quitting,
timeouts) are :mod:`.blocks`, a plain object without processes or clocks, that the
shell (:mod:`.processes`) executes. Worker functions (0-argument functions that run
their own ``daisy_nb.Client`` loop, often as a cluster job) are :mod:`.functions`.
Why a worker process ended, and whether it counts toward ``max_worker_restarts``,
is :func:`.exits.classify_exit`, a pure function.
"""

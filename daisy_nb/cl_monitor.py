"""``daisy.cl_monitor`` (daisy 1.x): ``CLMonitor(server)`` is accepted and does nothing.

daisy 1.x's command-line monitor printed progress from server events; progress bars
are built in now (``run_blockwise(progress=True)``), so constructing one only keeps
old scripts running.
"""

__all__ = ["CLMonitor"]


class CLMonitor:
    """No-op stand-in for daisy 1.x's progress monitor; keeps a reference to ``server``."""

    def __init__(self, server, *args, **kwargs):
        self.server = server

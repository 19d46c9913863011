"""``python -m daisy_nb.runtime.worker <fd> <parent_pid>``: the pool's worker process main.

Kept at this path for ``python -m``; the code is :mod:`daisy_nb.runtime.local.worker`.
"""

from daisy_nb.runtime.local.worker import main, run_as_main, serve

__all__ = ["main", "serve"]

if __name__ == "__main__":
    run_as_main()

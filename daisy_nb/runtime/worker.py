"""``python -m daisy_nb.runtime.worker <fd> <parent_pid>``: the pool's worker process main.

Kept at this path for ``python -m``; the code is :mod:`daisy_nb.runtime.local.worker`.
"""

import sys

from daisy_nb.runtime.local.worker import main, serve

__all__ = ["main", "serve"]

if __name__ == "__main__":
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)

"""``python -m daisy_nb.demo``: the functions run from the importable package, so worker
processes import them by name instead of unpickling copies from ``__main__``."""

import sys

from daisy_nb.demo import _cli

sys.exit(_cli())

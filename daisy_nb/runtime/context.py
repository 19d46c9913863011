"""``daisy_nb.runtime.context``: a public path kept for programs that import it; the module is
:mod:`daisy_nb.runtime.net.context`."""

from daisy_nb.runtime.net.context import Context

__all__ = ["Context"]

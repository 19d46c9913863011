"""The one place that spells numba's options for every kernel in daisy_nb.

No other module writes ``numba.njit(``: kernels are decorated with :data:`kernel`.
``nogil=True`` lets a kernel run beside Python threads; no ``fastmath`` (integer
kernels gain nothing) and no ``parallel`` (never combined with ``cache``).
``DAISY_NB_CACHE=0`` switches the on-disk cache off.
"""

import functools
import os

import numba

CACHE = os.environ.get("DAISY_NB_CACHE", "1") != "0"

kernel = functools.partial(numba.njit, nogil=True, cache=CACHE)

"""The one place that spells numba's options for every kernel, and that decides when to compile.

No other module writes ``numba.njit(``: kernels are decorated with :data:`kernel`,
:data:`inline_kernel` or :data:`flat_kernel`. ``nogil=True`` lets a kernel run beside
Python threads; no ``fastmath`` (integer kernels gain nothing) and no ``parallel``
(never combined with ``cache``). ``DAISY_NB_CACHE=0`` switches the on-disk cache off.

**Plain Python first.** Importing numba costs ~0.25 s and ~120 MiB, and loading the
cached kernels another 0.35-0.5 s: more than a whole small run takes. So a decorated
kernel stays the plain Python function it is written as (the same body, the single
source of truth) until compiling pays off. :func:`need` is told how much work is
coming (what it would cost in plain Python); once that work,
or all the plain work of this process so far, reaches :data:`COMPILE_AT` (the price of
loading numba and the kernels, in microseconds), :func:`use_numba` imports numba, wraps every kernel
in a dispatcher with its options, and rebinds the module globals of ``daisy_nb.kernels``
to the dispatchers, so that callers (which look kernels up as ``module.name``) and
kernels calling kernels (numba resolves globals when it compiles) see compiled code.
Plain mode gives the same results, order and counters: the kernels use only integer
arithmetic on int64/uint8 arrays, whose semantics numba and numpy share. Workers never
reach this module.

``DAISY_NB_JIT`` overrides the choice: ``auto`` (default), ``1`` (compile for any work,
however small: the first Scheduler or graph call switches), ``0`` (never compile; for
tests and debugging). :func:`set_mode` does the same from Python and switches at once.

numba decides whether a cached kernel is stale from the stamp of the file that
defines it only, so a kernel that calls a kernel from another file (all of
``surface.py`` calls ``graph.py``) would keep running old code after an edit.
:func:`_drop_stale_cache` therefore keys the whole cache on a hash of every
kernel source file and empties it when any of them changed. A run that finds the cache
empty says once on stderr that it compiles (see :func:`cache_is_warm`);
``python -m daisy_nb warmup`` compiles ahead of time.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from daisy_nb import config

__all__ = [
    "COMPILE_AT",
    "cache_is_warm",
    "compiled",
    "flat_kernel",
    "inline_kernel",
    "kernel",
    "mode",
    "compile_pays",
    "need",
    "set_mode",
    "use_numba",
    "use_python",
]

CACHE = config.CACHE.get()
_MODE = config.JIT.get()  # "auto", "numba" or "python"

# Compiling pays off once the kernels' work in plain Python would take longer than
# importing numba and loading the compiled kernels from the cache: 0.57-0.71 s measured
# on the 2-core test machine (numba's import 0.22-0.24 s, its first cached calls
# 0.34-0.5 s; `benchmarks/bench_small.py --calibrate` prints both sides). :func:`need`
# counts in microseconds of plain-Python kernel work; callers estimate theirs (the
# Scheduler from its block count and downstream fan-out, the graph per block).
COMPILE_AT = 600_000
# Below this share of a core the plain kernels never hold up a hand-out (blocks handed out
# slowly: long blocks, one by one, to a few workers); see compile_pays.
BUSY_SHARE = 0.05
# how long a compile from an empty cache takes (the kernels of a run, 2-core machine)
COMPILE_SECONDS = 15
WARMUP_SECONDS = 20  # every kernel (python -m daisy_nb warmup)

_HERE = Path(__file__).parent
KERNEL_MODULES = ("block_id", "graph", "surface")  # the modules that define kernels
_PKG = __name__.rpartition(".")[0]  # daisy_nb.kernels
_kernels: dict = {}  # py_func -> options, in definition order
_twins: dict = {}  # py_func -> its plain-Python twin (what plain mode calls instead; see plain_twin)
_dispatchers: dict = {}  # py_func -> numba dispatcher (made once)
_compiled = False
_plain_work = 0.0


def _register(**options):
    def decorate(fn):
        _kernels[fn] = options
        if _compiled:  # a kernel module imported after the switch
            return _dispatcher(fn, options)
        return fn

    return decorate


kernel = _register(nogil=True, cache=CACHE)

# Small helpers on the per-block hot path (level/counter arithmetic, FIFO, neighbour
# lists) are inlined into their callers at numba's IR level: a call between kernels
# passes every array as its expanded struct and touches reference counts, which cost
# more than these helpers' work.
inline_kernel = _register(nogil=True, cache=CACHE, inline="always")

# The scheduler's per-call entry point (``kernels/surface.py``: ``step``) is compiled
# without numba's reference-counting runtime: every array variable bound inside a loop
# (an inlined helper's argument, a row view) otherwise costs two atomic updates, and
# those were three quarters of a release. Such a kernel and everything it calls must not
# allocate; they work on views of buffers the caller owns for the whole call.
flat_kernel = _register(nogil=True, cache=CACHE, _nrt=False)


def plain_twin(fn, twin):
    """Plain mode calls ``twin`` for kernel ``fn`` (same arguments, same results); compiled mode
    calls ``fn``'s dispatcher. For an entry point whose body pays in Python for what numba
    does for free (``surface.step`` rebuilds 25 array views per call). Returns what the
    module global should be bound to now."""
    if fn not in _kernels:
        raise ValueError(f"{fn.__name__} is not a kernel")
    _twins[fn] = twin
    return _dispatcher(fn, _kernels[fn]) if _compiled else twin


def _dispatcher(fn, options):
    d = _dispatchers.get(fn)
    if d is None:
        import numba

        from ._numba_features import features

        if "_nrt" in options and not features()["nrt_option"]:  # a numba without it: refcounted, same results
            options = {k: v for k, v in options.items() if k != "_nrt"}
        d = _dispatchers[fn] = numba.njit(**options)(fn)
    return d


def _rebind(mapping: dict) -> None:
    """Replace, in every loaded kernel module, each global that is a key of ``mapping``."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == _PKG or name.startswith(_PKG + ".")):
            continue
        ns = vars(mod)
        for k, v in list(ns.items()):
            if callable(v):
                try:
                    new = mapping.get(v)
                except TypeError:  # unhashable
                    continue
                if new is not None:
                    ns[k] = new


def compiled() -> bool:
    """True once the kernels run compiled in this process."""
    return _compiled


def use_numba() -> None:
    """Compile from here on: import numba and rebind every kernel to its dispatcher.

    Compilation itself stays lazy (numba compiles, or loads from its cache, at the
    first call of each kernel); when the cache lacks the kernels, says so once.
    """
    global _compiled, _MODE
    if _compiled:
        return
    if CACHE:
        _drop_stale_cache()
    before = set(sys.modules)
    try:
        import numba  # noqa: F401
    except ImportError as e:  # a broken numba install: stay correct, only slower
        _MODE = "python"
        import warnings

        warnings.warn(
            f"daisy_nb: numba cannot be imported ({e}); the kernels run as plain Python", RuntimeWarning, stacklevel=3
        )
        return
    except BaseException:
        # interrupted half way (Ctrl-C while numba loads, ~0.3 s, seconds on a busy machine):
        # the packages whose import failed are gone from sys.modules, their submodules that
        # had loaded are not, and a later import of numba would find them without binding
        # them to the new package ("module 'numba' has no attribute 'core'": no kernel could
        # compile in this process again). Forget those; modules that loaded whole (numpy) stay.
        for name in set(sys.modules) - before:
            parts = name.split(".")
            if any(".".join(parts[:i]) not in sys.modules for i in range(1, len(parts))):
                sys.modules.pop(name, None)
        raise
    _install_notice()
    if CACHE and not cache_is_warm([fn for fn in _entry_points() if fn.__name__ == "step"]):
        _tell()  # before any progress bar is drawn: the scheduler's kernel is not cached

    mapping = {fn: _dispatcher(fn, opts) for fn, opts in _kernels.items()}
    mapping.update({twin: mapping[fn] for fn, twin in _twins.items()})
    _rebind(mapping)
    _compiled = True


def use_python() -> None:
    """Run the kernels as plain Python from here on (tests compare both modes)."""
    global _compiled
    if not _compiled:
        return
    _rebind({d: _twins.get(fn, fn) for fn, d in _dispatchers.items()})
    _compiled = False


def compile_pays(work_us: float, per_sec_us: float | None = None) -> bool:
    """Whether compiling pays for ``work_us`` microseconds of plain-Python kernel work.

    ``per_sec_us``: how much of that work comes per second of the run, when known (blocks
    handed out per second x microseconds per block). Loading numba and the kernels costs
    :data:`COMPILE_AT` once; compiled kernels cost next to nothing per block. So compiling
    pays once the plain work reaches that price (rent or buy: at most about twice the
    better choice's cost in hindsight). When the work is spread thin (the plain kernels
    would use under :data:`BUSY_SHARE` of a core) they never delay a hand-out, and the
    load, paid at once, must save its price twice over (``2 x COMPILE_AT``) to be worth it.
    """
    if work_us < COMPILE_AT:
        return False
    if per_sec_us is not None and per_sec_us < BUSY_SHARE * 1e6:
        return work_us >= 2 * COMPILE_AT
    return True


def need(us: float, per_sec_us: float | None = None) -> None:
    """Kernel work is coming that would take ``us`` microseconds in plain Python (``per_sec_us``
    of it per second of the run, when known).

    Compiles when this work alone, or with all plain work of the process so far, makes
    :func:`compile_pays` true.
    """
    global _plain_work
    if _compiled or _MODE == "python":
        return
    _plain_work += us
    if _MODE == "numba" or compile_pays(_plain_work, per_sec_us):
        use_numba()


def set_mode(mode: str) -> None:
    """``"auto"``, ``"numba"`` or ``"python"`` (as ``DAISY_NB_JIT``); switches now for the latter two."""
    global _MODE, _plain_work
    if mode not in ("auto", "numba", "python"):
        raise ValueError(f"mode must be 'auto', 'numba' or 'python', got {mode!r}")
    _MODE = mode
    _plain_work = 0.0
    if mode == "numba":
        use_numba()
    elif mode == "python":
        use_python()


def mode() -> str:
    """The current mode: ``"auto"``, ``"numba"`` or ``"python"``."""
    return _MODE


# -- the on-disk cache ---------------------------------------------------------------
def _drop_stale_cache() -> None:
    cache_dir = _HERE / "__pycache__"
    if config.NUMBA_CACHE_DIR.get():
        return  # a custom cache location: its owner manages it
    digest = hashlib.sha256()
    for src in sorted(_HERE.glob("*.py")):
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    key = digest.hexdigest()
    marker = cache_dir / "daisy_nb_kernels.hash"
    try:
        if marker.read_text() == key:
            return
    except OSError:
        pass
    try:
        cache_dir.mkdir(exist_ok=True)
        for f in list(cache_dir.glob("*.nbi")) + list(cache_dir.glob("*.nbc")):
            f.unlink(missing_ok=True)
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(key)
        os.replace(tmp, marker)
    except OSError:
        pass  # read-only install: numba falls back to its own cache handling


def _entry_points() -> list:
    """Kernels that run on their own (not inlined): each has its own cache entry."""
    import importlib

    for sub in KERNEL_MODULES:  # every kernel registers itself when its module loads
        importlib.import_module(f"{_PKG}.{sub}")
    return [fn for fn, opts in _kernels.items() if opts.get("inline") != "always"]


def cache_is_warm(kernels=None) -> bool:
    """True if numba's cache holds a current index for every entry-point kernel (or ``kernels``).

    Asks numba's own cache object of each kernel (its index file, numba's version and
    the source's stamp), so custom and user-wide cache locations count too. Imports numba.
    """
    if not CACHE:
        return False
    from ._numba_features import features

    if not features()["cache_index"]:  # a numba without the internals: assume it must compile
        return False
    _drop_stale_cache()
    for fn in _entry_points() if kernels is None else kernels:
        try:
            if not _dispatcher(fn, _kernels[fn])._cache._cache_file._load_index():
                return False
        except Exception:  # numba without these internals: assume it must compile
            return False
    return True


def _compile_estimate() -> int:
    """Seconds a compile of the kernels that are not cached yet will take (rough, 2 cores)."""
    cold = [fn for fn in _entry_points() if not cache_is_warm([fn])]
    if any(fn.__name__ == "step" for fn in cold):
        return COMPILE_SECONDS
    return max(1, round(len(cold) * COMPILE_SECONDS / max(1, len(_entry_points()))))


_told = False
_notice_installed = False  # numba keeps every listener: one for the whole process


def _tell() -> None:
    global _told
    if not _told:
        _told = True
        print(
            f"daisy_nb: compiling kernels, once, ~{_compile_estimate()} s "
            "(`python -m daisy_nb warmup` does it ahead of time)",
            file=sys.stderr,
            flush=True,
        )


def _install_notice() -> None:
    """Say once on stderr that kernels compile: numba's "numba:compile" event fires only
    on a cache miss, just before the compiler runs. Installed once (tests switch modes)."""
    global _notice_installed
    from ._numba_features import features

    if _notice_installed or not features()["compile_event"]:
        return
    from numba.core import event

    class CompileNotice(event.Listener):
        def on_start(self, ev):
            disp = (ev.data or {}).get("dispatcher")
            if not _told and getattr(getattr(disp, "py_func", None), "__module__", "").startswith(_PKG):
                _tell()

        def on_end(self, ev):
            pass

    event.register("numba:compile", CompileNotice())
    _notice_installed = True

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
A Scheduler's work comes over many calls, so it asks with ``spread=True``: numba then loads in
a background thread while the plain kernels serve the first blocks, and :func:`poll` (at each
hand-out) switches between two calls once it is loaded (the section "loading in the
background" below).
Plain mode gives the same results, order and counters: the kernels use only integer
arithmetic on int64/uint8 arrays, whose semantics numba and numpy share. Workers never
reach this module.

``DAISY_NB_JIT`` overrides the choice: ``auto`` (default), ``1`` (compile for any work,
however small: the first Scheduler or graph call switches), ``0`` (never compile; for
tests and debugging). :func:`set_mode` does the same from Python and switches at once;
both compile synchronously, never in the background.

numba decides whether a cached kernel is stale from the stamp of the file that
defines it only, so a kernel that calls a kernel from another file (all of
``surface.py`` calls ``graph.py``) would keep running old code after an edit.
:func:`_drop_stale_cache` therefore keys the whole cache on a hash of every
kernel source file and empties it when any of them changed. A run that finds the cache
empty says once on stderr that it compiles (see :func:`cache_is_warm`);
``python -m daisy_nb warmup`` compiles ahead of time.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import types
from collections.abc import Callable
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
    "loading",
    "need",
    "poll",
    "set_mode",
    "settle",
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
_shadows: dict = {}  # module name -> the compiled world's copy of its globals (see _compiled_twin)
_lock = threading.Lock()


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
    with _lock:  # the loader thread and the caller may both ask (cache_is_warm, a late kernel module)
        d = _dispatchers.get(fn)
        if d is None:
            import numba

            from ._numba_features import features

            if "_nrt" in options and not features()["nrt_option"]:  # a numba without it: refcounted, same results
                options = {k: v for k, v in options.items() if k != "_nrt"}
            d = _dispatchers[fn] = numba.njit(**options)(_compiled_twin(fn))
    return d


def _compiled_twin(fn):
    """``fn`` with the compiled world's globals: its module's, each kernel replaced by its dispatcher.

    numba resolves a kernel's callees in its globals when it compiles. The module's own globals
    stay plain until the switch (:func:`_switch`), and a background compile must not see them
    (``Untyped global name``) nor change them under the plain kernels that serve meanwhile. The
    twin shares the code object, so numba's cache (keyed by file, qualified name and bytecode)
    is the same. Functions outside the kernel modules (tests) are compiled as they are.
    """
    mod = getattr(fn, "__module__", "") or ""
    if not (mod == _PKG or mod.startswith(_PKG + ".")) or mod not in sys.modules:
        return fn
    shadow = _shadows.get(mod)
    if shadow is None:  # a copy: kernels are filled in by _fill_shadows once their dispatchers exist
        shadow = _shadows[mod] = dict(vars(sys.modules[mod]))
    twin = types.FunctionType(fn.__code__, shadow, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__ = fn.__qualname__
    twin.__doc__ = fn.__doc__
    return twin


def _replace_in(ns: dict, mapping: dict) -> None:
    """Replace each value of namespace ``ns`` that is a key of ``mapping`` by what it maps to."""
    for k, v in list(ns.items()):
        if callable(v):
            try:
                new = mapping.get(v)
            except TypeError:  # unhashable
                continue
            if new is not None:
                ns[k] = new


def _fill_shadows(mapping: dict) -> None:
    """Point every kernel name of the compiled world's globals at its dispatcher."""
    for shadow in _shadows.values():
        _replace_in(shadow, mapping)


def _rebind(mapping: dict) -> None:
    """Replace, in every loaded kernel module, each global that is a key of ``mapping``."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == _PKG or name.startswith(_PKG + ".")):
            _replace_in(vars(mod), mapping)


def compiled() -> bool:
    """True once the kernels run compiled in this process."""
    return _compiled


def loading() -> bool:
    """True while numba and the kernels load in the background (the kernels run plain meanwhile)."""
    return _loader is not None


def _import_numba() -> None:
    before = set(sys.modules)
    try:
        import numba  # noqa: F401
    except ImportError:
        raise
    except BaseException:
        # interrupted half way (Ctrl-C while numba loads, ~0.3 s, seconds on a busy machine;
        # or the loader thread stopped at exit): the packages whose import failed are gone from
        # sys.modules, their submodules that had loaded are not, and a later import of numba
        # would find them without binding them to the new package ("module 'numba' has no
        # attribute 'core'": no kernel could compile in this process again). Forget those;
        # modules that loaded whole (numpy) stay.
        for name in set(sys.modules) - before:
            parts = name.split(".")
            if any(".".join(parts[:i]) not in sys.modules for i in range(1, len(parts))):
                sys.modules.pop(name, None)
        raise


def _prepare() -> dict:
    """Import numba and make every kernel's dispatcher; returns kernel (and twin) -> dispatcher.

    Changes nothing the plain kernels use: the module globals are rebound by :func:`_switch`.
    Raises ImportError for a broken numba install.
    """
    if CACHE:
        _drop_stale_cache()
    _import_numba()
    _entry_points()  # every kernel module loaded: their dispatchers see each other (_compiled_twin)
    _install_notice()
    if CACHE and not cache_is_warm([fn for fn in _entry_points() if fn.__name__ == "step"]):
        _tell()  # before any progress bar is drawn: the scheduler's kernel is not cached
    mapping = {fn: _dispatcher(fn, opts) for fn, opts in list(_kernels.items())}
    mapping.update({twin: mapping[fn] for fn, twin in _twins.items()})
    _fill_shadows(mapping)
    return mapping


def _load(mapping: dict) -> None:
    """Load (or compile) the Scheduler's entry point, ``surface.step``, ahead of its first call:
    every signature numba's cache holds for it, and the one a Scheduler calls even from an
    empty cache. The other kernels load at their first call, as in the synchronous switch
    (loading all of them took 2.6 s on the loaded 2-core machine, ``step`` alone ~1.4 s)."""
    import numpy as np
    from numba import typeof

    ints = (np.zeros(1, np.int64), np.zeros(1, np.uint8), np.zeros(1, np.int32))
    step_sig = tuple(typeof(a) for a in (*ints, 0, 0, 0, 0, ints[0], ints[1]))
    for fn in _entry_points():
        if fn.__name__ != "step":
            continue
        d = mapping[fn]
        if not hasattr(d, "compile"):  # NUMBA_DISABLE_JIT: numba.njit gave the function back
            return
        sigs = []
        try:
            magic = d.targetctx.codegen().magic_tuple()
            index = d._cache._cache_file._load_index() if CACHE else {}
            sigs = [key[0] for key in index if key[1] == magic]
        except Exception:  # numba without these internals: the canonical signature only
            pass
        for sig in [step_sig, *(s for s in sigs if s != step_sig)]:
            d.compile(sig)


def _switch(mapping: dict) -> None:
    """Rebind every kernel module global to its dispatcher: the kernels run compiled from here on."""
    global _compiled
    _rebind(mapping)
    _compiled = True


def _broken_numba(e: BaseException) -> None:
    global _MODE
    _MODE = "python"
    import warnings

    warnings.warn(
        f"daisy_nb: numba cannot be imported ({e}); the kernels run as plain Python", RuntimeWarning, stacklevel=4
    )


def use_numba() -> None:
    """Compile from here on: import numba and rebind every kernel to its dispatcher.

    Synchronous: when numba loads in the background (:func:`need` with ``spread``), waits for
    it. Otherwise compilation itself stays lazy (numba compiles, or loads from its cache, at
    the first call of each kernel); when the cache lacks the kernels, says so once.
    """
    if _compiled:
        return
    if _loader is not None:
        _loader.thread.join()
        _finish()
        return
    try:
        mapping = _prepare()
    except ImportError as e:  # a broken numba install: stay correct, only slower
        _broken_numba(e)
        return
    _switch(mapping)


# -- loading in the background ----------------------------------------------------------
# A Scheduler's kernel work comes over many calls (one per hand-out and release), so it need
# not wait for numba: need(..., spread=True) starts a _Loader thread that imports numba, makes
# the dispatchers and loads the cached entry points (compiles them from an empty cache), while
# the plain kernels keep serving; poll(), called by the Scheduler between its kernel calls,
# rebinds once the thread is done. The thread changes no module global: the switch happens on
# the caller's thread, between two calls, never inside one. See docs/explanation/architecture.md
# (#plain-python-first) for the figures.
BACKGROUND = True  # False: load synchronously, as before (benchmarks/bench_startup.py compares)


class _Stopped(BaseException):
    """Raised inside the loader thread at interpreter exit (see :func:`_stop_loaders`)."""


class _Loader:
    """One background load of numba and the kernels; its outcome is read by :func:`_finish`."""

    def __init__(self) -> None:
        self.mapping: dict | None = None
        self.error: BaseException | None = None
        # not a daemon: the interpreter joins it at exit, after _stop_loaders stopped it
        self.thread = threading.Thread(target=self._run, name="daisy_nb-kernels-load")

    def _run(self) -> None:
        try:
            try:
                if _load_hook is not None:
                    _load_hook("start")
                mapping = _prepare()
                if _load_hook is not None:
                    _load_hook("prepared")
                _load(mapping)
                self.mapping = mapping
                if _load_hook is not None:
                    _load_hook("loaded")
            except BaseException as e:  # read on the caller's thread (ImportError, a compile error, _Stopped)
                self.error = e
        except _Stopped:  # stopped at exit while storing the outcome: nobody reads it
            pass


_loader: _Loader | None = None  # the load in flight, until its switch
_running: list[_Loader] = []  # loaders whose thread may still run (stopped at exit)
_exit_hook = False  # _stop_loaders registered
# tests: called in the loader thread with "start" (before numba's import), "prepared", "loaded"
_load_hook: Callable[[str], None] | None = None


def _start_loading() -> None:
    global _loader
    if _loader is not None:
        return
    global _exit_hook
    loader = _Loader()
    if not _exit_hook:
        try:  # runs before the interpreter joins its threads (concurrent.futures uses it too)
            threading._register_atexit(_stop_loaders)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # the interpreter is exiting (or no such hook): load now
            use_numba()
            return
        _exit_hook = True
    _loader = loader
    _running.append(loader)
    loader.thread.start()


def _stop_loaders() -> None:
    """At exit: stop a loader thread that still runs (raise _Stopped in it), so the interpreter's
    join of it returns at once rather than after numba's import or a compile. It raises at its
    next Python instruction (a call into LLVM finishes first); nothing it made is used."""
    for loader in _running:
        ident = loader.thread.ident
        if loader.thread.is_alive() and ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Stopped))
    _running.clear()


def _finish() -> None:
    """The load is done: switch to its dispatchers, or stay plain if it failed."""
    global _loader
    loader, _loader = _loader, None
    if loader is None:
        return
    if loader in _running:
        _running.remove(loader)
    if loader.error is None and loader.mapping is not None:
        _switch(loader.mapping)
    elif isinstance(loader.error, ImportError):
        _broken_numba(loader.error)
    elif loader.error is not None and not isinstance(loader.error, _Stopped):
        raise loader.error  # a kernel that does not compile: as the first call would raise it


def poll() -> bool:
    """Switch to the compiled kernels if their background load is done; True unless a load is
    still pending. Cheap: the Scheduler calls it at every hand-out while numba loads."""
    loader = _loader
    if loader is None:
        return True
    if loader.thread.is_alive():
        # hand the GIL over: the loader's many short calls into LLVM (ctypes) each release it and
        # then wait for it; a caller that never waits would make each of them wait a whole switch
        # interval (5 ms): the load then took ~10x longer while blocks were handed out back to back
        time.sleep(0)
        return False
    _finish()
    return True


def settle() -> None:
    """Wait for a background load and switch now (tests, benchmarks); nothing if none runs."""
    if _loader is not None:
        _loader.thread.join()
        _finish()


def use_python() -> None:
    """Run the kernels as plain Python from here on (tests compare both modes)."""
    global _compiled, _loader
    _loader = None  # a load still in flight is never switched to (its thread ends on its own)
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


def need(us: float, per_sec_us: float | None = None, spread: bool = False) -> None:
    """Kernel work is coming that would take ``us`` microseconds in plain Python (``per_sec_us``
    of it per second of the run, when known).

    Compiles when this work alone, or with all plain work of the process so far, makes
    :func:`compile_pays` true. ``spread``: the work comes over many later calls (a Scheduler's
    hand-outs and releases), so numba loads in the background while the plain kernels serve,
    and :func:`poll` switches between two calls; otherwise (one big call coming, or
    ``DAISY_NB_JIT=1``) it loads now, waiting for a background load in flight.
    """
    global _plain_work
    if _compiled or _MODE == "python":
        return
    _plain_work += us
    if _MODE == "numba" or compile_pays(_plain_work, per_sec_us):
        if spread and BACKGROUND and _MODE == "auto":
            _start_loading()
            poll()
        else:
            use_numba()
    elif _loader is not None:
        poll()


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
    import hashlib  # here: a run that never compiles does not load OpenSSL's hashlib

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

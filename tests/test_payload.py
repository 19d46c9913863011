"""How a task's functions travel to its workers (``daisy_nb/runtime/common/payload.py``): plain
pickle by reference for an importable module's functions, cloudpickle by value for the rest."""

import functools
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daisy_nb.runtime.common.payload import payload_imports, serialize_function

ROOT = Path(__file__).resolve().parents[1]


def _in_fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_a_modules_function_goes_by_reference_without_cloudpickle():
    """``functools.partial`` of a module's function (the demo's kind): the bytes plain pickle
    makes, loadable without cloudpickle, and cloudpickle never loaded."""
    out = _in_fresh(
        """
        import functools, pickle, sys, colorsys
        from daisy_nb.runtime.common.payload import serialize_function
        data = serialize_function(functools.partial(colorsys.rgb_to_hsv, 0.5), None, "t")
        fn, init = pickle.loads(data)
        print(fn(0.5, 0.5), init, "cloudpickle" in sys.modules, b"cloudpickle" in data)
        """
    )
    assert out == "(0.0, 0.0, 0.5) None False False"


def test_functions_of_main_go_by_value():
    """A script's functions (``__main__``) cannot be imported by a worker: cloudpickle sends them
    by value, and another interpreter runs them."""
    data = _in_fresh(
        """
        import sys
        from daisy_nb.runtime.common.payload import serialize_function
        def fn(x):
            return x * 7
        sys.stdout.write(serialize_function(fn, None, "t").hex())
        """
    )
    fn, _ = pickle.loads(bytes.fromhex(data))
    assert fn(6) == 42


def test_what_plain_pickle_refuses_goes_by_value():
    def closure(x, _k=3):
        return x + _k

    fn, init = pickle.loads(serialize_function(closure, functools.partial(int, "5"), "t"))
    assert fn(1) == 4 and init() == 5


def test_a_program_that_loaded_cloudpickle_gets_cloudpickle():
    """It may have registered a module to go by value (``register_pickle_by_value``), which only
    cloudpickle honours: a module registered so is sent by value, not by reference."""
    cloudpickle = pytest.importorskip("cloudpickle")
    sys.path.insert(0, str(Path(__file__).parent / "workers"))
    try:
        import blockfns

        cloudpickle.register_pickle_by_value(blockfns)
        try:
            data = serialize_function(blockfns.noop, None, "t")
        finally:
            cloudpickle.unregister_pickle_by_value(blockfns)
    finally:
        sys.path.remove(str(Path(__file__).parent / "workers"))
    assert b"_make_function" in data  # by value (by reference, the bytes would name blockfns.noop only)


def test_an_unpicklable_function_is_a_clear_error():
    import threading

    lock = threading.Lock()

    with pytest.raises(RuntimeError, match="could not serialize the process_function/init_fn of task 'u'"):
        serialize_function(lambda b: lock, None, "u")


def record_cloudpickle_stats(block):  # by reference: a name with "cloudpickle" in it
    return block


def test_a_workers_template_loads_cloudpickle_only_for_a_payload_sent_by_value():
    """``payload_imports``: what a worker template loads before forking a worker of the task."""
    cloudpickle = pytest.importorskip("cloudpickle")
    assert payload_imports(pickle.dumps((record_cloudpickle_stats, None))) == ()
    assert payload_imports(cloudpickle.dumps((lambda b: b, None))) == ("cloudpickle",)
    assert payload_imports(cloudpickle.dumps((functools.partial(max, 1), None))) == ()  # by reference
    assert payload_imports(None) == ()

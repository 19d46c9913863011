"""Fixed costs: when compiling the kernels pays (``kernels/_jit.py``), and a whole run that must not pay it.

The rule is a pure function (:func:`daisy_nb.kernels._jit.compile_pays`), tested here on its
own; the end-to-end check runs a TCP run the way a cluster does (worker functions that
start detached ``Client`` programs, one block per request) in a fresh driver process and
looks at that process's ``sys.modules`` afterwards.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daisy_nb.kernels import _jit

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"


def test_little_work_never_compiles():
    assert not _jit.compile_pays(0)
    assert not _jit.compile_pays(_jit.COMPILE_AT - 1)
    assert not _jit.compile_pays(_jit.COMPILE_AT - 1, per_sec_us=1e6)  # however dense


def test_enough_work_compiles_when_its_rate_is_unknown_or_dense():
    assert _jit.compile_pays(_jit.COMPILE_AT)
    assert _jit.compile_pays(_jit.COMPILE_AT, per_sec_us=_jit.BUSY_SHARE * 1e6)  # at the share: dense
    assert _jit.compile_pays(10 * _jit.COMPILE_AT, per_sec_us=0.9e6)


def test_work_spread_thin_must_save_the_price_twice():
    thin = _jit.BUSY_SHARE * 1e6 / 2  # the plain kernels would use 2.5 % of a core
    assert not _jit.compile_pays(_jit.COMPILE_AT, per_sec_us=thin)
    assert not _jit.compile_pays(2 * _jit.COMPILE_AT - 1, per_sec_us=thin)
    assert _jit.compile_pays(2 * _jit.COMPILE_AT, per_sec_us=thin)


def test_the_rule_is_monotone_in_the_work():
    for rate in (None, 1e3, 0.04e6, 0.05e6, 1e6):
        seen_true = False
        for work in range(0, 3 * _jit.COMPILE_AT, _jit.COMPILE_AT // 50):
            pays = _jit.compile_pays(work, per_sec_us=rate)
            assert pays or not seen_true, (work, rate)  # once it pays, more work pays too
            seen_true |= pays


def test_the_schedulers_estimate_leaves_12800_blocks_one_by_one_plain():
    """The estimate behind the run below: a 1-D task of 12,800 blocks, one downstream entry."""
    from daisy_nb.scheduler import _US_BLOCK, _US_PER_DOWNSTREAM

    assert not _jit.compile_pays(12_800 * (_US_BLOCK + _US_PER_DOWNSTREAM))
    assert _jit.compile_pays(100_000 * (_US_BLOCK + _US_PER_DOWNSTREAM))


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(240)
def test_a_tcp_run_of_12800_blocks_one_by_one_does_not_load_numba(tmp_path):
    """12,800 blocks handed out one by one to 4 detached Client programs (the cluster pattern):
    the driver never imports numba, and every block completes."""
    out = tmp_path / "out"
    out.mkdir()
    code = textwrap.dedent(
        """
        import json, sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        import cluster
        t = daisy.Task("tcp", Roi((0,), (12800,)), Roi((0,), (1,)), Roi((0,), (1,)),
                       process_function=cluster.submit, max_workers=4, read_write_conflict=False)
        states = daisy.run_blockwise([t], host="127.0.0.1", return_states=True, progress=False, summary=False)
        st = states["tcp"]
        print(json.dumps({"numba": "numba" in sys.modules, "completed": st.completed_count}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DAISY_NB_JIT", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(WORKERS)]), DAISY_NB_TEST_OUT=str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=230)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"numba": False, "completed": 12800}
    jobs = list(out.glob("rc_*"))
    assert jobs and all(p.read_text() == "0" for p in jobs)


def _fresh(code: str, tmp_path, *path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DAISY_NB_JIT", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, (ROOT, *path)))
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_DEFERRED = """
    import json, sys, time
    import daisy_nb as daisy
    from daisy_nb import Roi, scheduler
    from daisy_nb.kernels import _jit
    # a short look at the rate: most of the work is still ahead when the decision is taken, however
    # fast this machine's plain kernels hand the first blocks out
    scheduler._PACE_SECS = 0.02
    # work between the price and twice it: the decision waits for the hand-out rate; near twice, so
    # that most of it is still ahead after the first moments (plain batches hand out ~5k blocks/20 ms)
    n = 125_000
    assert _jit.COMPILE_AT <= n * (scheduler._US_BLOCK + scheduler._US_PER_DOWNSTREAM) < 2 * _jit.COMPILE_AT
    s = daisy.Scheduler([daisy.Task("s", Roi((0,), (n,)), Roi((0,), (1,)), Roi((0,), (1,)), read_write_conflict=False)])
    at_init = "numba" in sys.modules
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        {hand_out}
    decided = _jit.loading() or _jit.compiled()  # numba loads in the background once decided
    _jit.settle()
    print(json.dumps({{"at_init": at_init, "compiled": decided and _jit.compiled(), "numba": "numba" in sys.modules}}))
"""


def test_blocks_handed_out_fast_compile_after_the_first_moments(tmp_path):
    """Batches as fast as the kernels go (a pool of short blocks): the rate says the plain kernels
    would be busy, so the kernels compile, after the first _PACE_SECS rather than at once."""
    hand_out = "b = s.acquire_blocks('s', 64); s.release_blocks('s', b.index, [2] * len(b))"
    res = _fresh(_DEFERRED.format(hand_out=hand_out), tmp_path)
    assert res == {"at_init": False, "compiled": True, "numba": True}


def test_blocks_handed_out_slowly_stay_plain(tmp_path):
    """One block every 10 ms (long blocks, one by one): the plain kernels would use well under
    BUSY_SHARE of a core and the work is under twice the price, so numba is never loaded."""
    hand_out = "b = s.acquire_block('s'); time.sleep(0.01); b.status = daisy.BlockStatus.SUCCESS; s.release_block(b)"
    res = _fresh(_DEFERRED.format(hand_out=hand_out), tmp_path)
    assert res == {"at_init": False, "compiled": False, "numba": False}


_TCP_SERVER = ("daisy_nb.runtime.net.server", "daisy_nb.runtime.net.handout", "daisy_nb.runtime.net.transport")

_LISTENS = """
    import json, sys
    import daisy_nb as daisy
    from daisy_nb import Roi

    def block(b):
        pass

    def function():  # a 0-argument worker function: its Client connects over TCP
        c = daisy.Client()
        while True:
            with c.acquire_block() as b:
                if b is None:
                    break

    t = daisy.Task("t", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)),
                   process_function={fn}, max_workers=2, read_write_conflict=False)
    states = daisy.run_blockwise([t], host={host}, return_states=True, progress=False, summary=False)
    print(json.dumps({{"completed": states["t"].completed_count,
                       "loaded": sorted(m for m in {modules} if m in sys.modules)}}))
"""


def test_a_run_of_block_functions_does_not_load_the_tcp_server(tmp_path):
    """No task's worker function connects over TCP: the run neither listens nor loads the TCP
    server (its memory counts in every local run's peak); one that does, loads it and completes."""
    plain = _fresh(_LISTENS.format(fn="block", host=None, modules=_TCP_SERVER), tmp_path)
    assert plain == {"completed": 4, "loaded": []}
    listens = _fresh(_LISTENS.format(fn="function", host='"127.0.0.1"', modules=_TCP_SERVER), tmp_path)
    assert listens == {"completed": 4, "loaded": sorted(_TCP_SERVER)}


def test_a_run_without_block_tracking_does_not_load_openssl(tmp_path):
    """``hashlib`` loads OpenSSL's libcrypto (about 4 MB of the process's memory and 1.5 ms): a
    local run of block functions without block tracking has no digest to take (its listener's
    secret is ``os.urandom``, the import memory's file name a checksum), so it does not import
    it. Nor does a tracked task, which hashes its layout (SHA-256, the tracking format) with
    CPython's own implementation (``test_a_run_of_block_functions_loads_only_what_it_uses``);
    a TCP run tags its frames and loads it, where it is used."""
    modules = ("hashlib", "hmac", "secrets")
    assert _fresh(_LISTENS.format(fn="block", host=None, modules=modules), tmp_path) == {"completed": 4, "loaded": []}


# what a run of block functions never uses unless asked for, and what asks for it: a speculative
# task (the backup rules), a store whose volume grew (the migration), a function of the program's
# __main__ (cloudpickle: runtime/common/payload.py), the statistics module (the runtime's medians
# are its own, daisy_nb/scheduling/median.py), the Client's frames
_UNUSED = (
    "cloudpickle",
    "statistics",
    "daisy_nb.scheduling.speculation",
    "daisy_nb.tracking._grow",
    "daisy_nb.runtime.net.wire",
    "daisy_nb.profiling",
    "hashlib",  # OpenSSL's libcrypto: a tracked task's layout hash is CPython's own SHA-256
    "_hashlib",
    "multiprocessing.connection",  # the workers' socket pairs are runtime/local/_pipe.py's
    "ctypes.util",  # runs ldconfig to find the C library the process has loaded anyway
)

_PLAIN = """
    import json, sys
    import blockfns
    import daisy_nb as daisy
    from daisy_nb import Roi

    def block(b):  # a function of __main__: it travels by value
        pass

    daisy.set_tracking_basedir("tracking")  # the stores are opened (and written) as a user's would be
    t = daisy.Task("t", Roi((0, 0), (40, 40)), Roi((0, 0), (12, 12)), Roi((1, 1), (10, 10)),
                   process_function={fn}, max_workers=2, read_write_conflict=True, max_retries=1{extra})
    states = daisy.run_blockwise([t], return_states=True, progress=False, summary=False)
    print(json.dumps({{"completed": states["t"].completed_count,
                       "loaded": sorted(m for m in {modules} if m in sys.modules)}}))
"""


def test_a_run_of_block_functions_loads_only_what_it_uses(tmp_path):
    """Every module a local run imports stays in its process's memory through what the program
    does next (the main job's peak is its whole-volume check after the run). A plain run of a
    module's block function on a tracked task loads none of the parts it never uses; a
    function of ``__main__`` loads cloudpickle and a speculative task the backup rules, and
    both complete."""

    def fresh(name: str, fn: str, extra: str = "") -> dict:
        (tmp_path / name).mkdir()
        return _fresh(_PLAIN.format(fn=fn, extra=extra, modules=_UNUSED), tmp_path / name, WORKERS)

    assert fresh("plain", "blockfns.noop") == {"completed": 9, "loaded": []}
    assert fresh("main", "block") == {"completed": 9, "loaded": ["cloudpickle"]}
    spec = fresh("speculative", "blockfns.noop", ", speculative=True")
    assert spec == {"completed": 9, "loaded": ["daisy_nb.scheduling.speculation"]}


def test_the_command_line_loads_only_the_command_it_runs(tmp_path):
    """``python -m daisy_nb demo`` carried the dashboard's and the status report's code (the
    other commands' options) through its whole run: only the running command's options load."""
    code = """
        import json, sys
        from daisy_nb.__main__ import build_parser
        others = ("daisy_nb.dashboard", "daisy_nb.status", "daisy_nb.status_cli", "daisy_nb.warmup",
                  "daisy_nb.tracking._cli")
        build_parser(None, only={only!r})
        print(json.dumps({{"loaded": sorted(m for m in others if m in sys.modules)}}))
    """
    assert _fresh(code.format(only=None), tmp_path) == {"loaded": []}  # demo (run by name), --help, --version
    assert _fresh(code.format(only="status"), tmp_path) == {"loaded": ["daisy_nb.status", "daisy_nb.status_cli"]}
    assert _fresh(code.format(only=""), tmp_path)["loaded"] == [  # every command's (the docs' page)
        "daisy_nb.dashboard",
        "daisy_nb.status",
        "daisy_nb.status_cli",
        "daisy_nb.tracking._cli",
        "daisy_nb.warmup",
    ]

"""Errors grouped by exception type and message shape: the grouping, the end-of-run summary,
``TaskState.error_groups`` after a real pool run, and ``daisy-nb status --logs``."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.errors import MAX_GROUPS, ErrorGroups, format_groups, groups_from_logs, message_shape, split_error
from daisy_nb.progress import print_summary

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "workers"))
import errfns  # noqa: E402


def _tb(exc: str, where: str = "/data/run7/x.py", line: int = 12, block: int | None = 7) -> str:
    head = f"block ('t', {block}) failed:\n" if block is not None else ""
    return f'{head}Traceback (most recent call last):\n  File "{where}", line {line}, in f\n    boom()\n{exc}\n'


def test_message_shape_normalises_numbers_hex_paths_and_quotes():
    a = message_shape("index 1234 is out of bounds for axis 0 with size 1000")
    b = message_shape("index 99 is out of bounds for axis 0 with size 1000")
    assert a == b == "index <n> is out of bounds for axis <n> with size <n>"
    assert message_shape("cannot open /scratch/u1/vol.zarr/c/0.1") == message_shape("cannot open /tmp/a/b")
    assert message_shape("object at 0x7f3a2b10 gone") == message_shape("object at 0xdeadbeef gone")
    assert message_shape("no key 'abc' in store") == message_shape('no key "zz9" in store')
    assert message_shape("timeout after 3.5s") != message_shape("connection refused")


def test_split_error_finds_the_exception_and_the_block():
    assert split_error(_tb("ValueError: bad value 3", block=41)) == ("ValueError", "bad value 3", 41)
    assert split_error(_tb("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3 GiB"))[0] == (
        "_ArrayMemoryError"
    )
    assert split_error("block 5 failed:\nTraceback...\nKeyError\n")[:1] == ("KeyError",)
    # a worker's message quoting its stderr tail is a worker error, typed by its first line
    t, m, b = split_error("daisy worker process exited with code 1\nworker stderr tail:\n" + _tb("ValueError: x"))
    assert (t, m, b) == ("worker error", "daisy worker process exited with code 1", None)


def test_groups_count_first_last_and_first_traceback():
    g = ErrorGroups("t")
    g.roi_of = lambda bid: {"write_roi": {"offset": [bid * 10], "shape": [10]}}
    for bid in (7, 3, 11):
        g.add(_tb(f"IndexError: index {bid * 100} is out of bounds for axis 0 with size 5", block=bid), log="w0.err")
    g.add(_tb("KeyError: 'missing'", block=5))
    g.add("daisy worker process exited with code 1")
    g.add("daisy worker process exited with code 137")
    lst = g.as_list()
    assert [x["count"] for x in lst] == [3, 2, 1] and g.total == 6
    ie = lst[0]
    assert ie["type"] == "IndexError" and ie["first_block"] == 7 and ie["last_block"] == 11
    assert ie["first_roi"] == {"write_roi": {"offset": [70], "shape": [10]}}
    assert ie["last_roi"] == {"write_roi": {"offset": [110], "shape": [10]}}
    assert "index 700 is out" in ie["traceback"] and ie["log"] == "w0.err"
    assert lst[1]["type"] == "worker error" and lst[1]["first_block"] is None
    text = "\n".join(format_groups(lst))
    assert "3 × IndexError" in text and "first block 7 write ROI offset (70), shape (10)" in text
    assert "last block  11" in text and "log: w0.err" in text


def test_groups_are_bounded():
    g = ErrorGroups("t")
    for i in range(MAX_GROUPS * 3):
        g.add(_tb(f"Error{chr(65 + i % 26)}{i}Error: distinct"))  # a new type each time
    assert len(g) == MAX_GROUPS + 1
    other = [x for x in g.as_list() if x["type"] == "(other errors)"]
    assert other and other[0]["count"] == MAX_GROUPS * 3 - MAX_GROUPS
    assert g.total == MAX_GROUPS * 3


def _task(tmp_path, name="grp", n=60, **kw):
    return daisy_nb.Task(
        name,
        total_roi=Roi((0,), (n * 10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=errfns.work,
        read_write_conflict=False,
        max_workers=2,
        max_retries=0,
        **kw,
    )


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_a_pool_run_groups_its_failures_and_the_summary_shows_them(tmp_path, monkeypatch, no_leaks):
    # blocks 3, 9 and 21 raise an IndexError (its message carries the block's number), 14 a KeyError
    monkeypatch.setenv("ERR_INDEX", "3,9,21")
    monkeypatch.setenv("ERR_KEY", "14")
    states = daisy_nb.run_blockwise(
        [_task(tmp_path)], progress=False, summary=False, return_states=True, log_dir=str(tmp_path / "logs")
    )
    st = states["grp"]
    assert st.failed_count == 4
    groups = st.error_groups.as_list()
    blocks = {g["type"]: g for g in groups if g["type"] != "worker error"}
    assert set(blocks) == {"IndexError", "KeyError"}
    ie = blocks["IndexError"]
    assert ie["count"] == 3 and {ie["first_block"], ie["last_block"]} <= {3, 9, 21}
    assert ie["first_block"] != ie["last_block"]
    assert ie["first_roi"]["write_roi"] == {"offset": [ie["first_block"] * 10], "shape": [10]}
    assert ie["last_roi"]["write_roi"] == {"offset": [ie["last_block"] * 10], "shape": [10]}
    assert "Traceback" in ie["traceback"] and "errfns.py" in ie["traceback"]
    assert ie["log"] and Path(ie["log"]).is_file() and Path(ie["log"]).parent == tmp_path / "logs" / "grp"
    assert blocks["KeyError"]["count"] == 1 and blocks["KeyError"]["first_block"] == 14
    buf = io.StringIO()
    print_summary(states, ["grp"], {"grp": 1.0}, file=buf)
    out = buf.getvalue()
    # daisy's summary first (unchanged), the groups after it
    assert out.index("Execution Summary") < out.index("First failure in task 'grp'") < out.index("Errors by kind")
    assert "3 × IndexError: index" in out and "1 × KeyError" in out
    assert "4 block error(s)" in out


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_status_groups_the_failures_of_the_worker_logs(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("ERR_INDEX", "2,5")
    track = tmp_path / "tracking"
    task = _task(tmp_path, "st", 30, tracking_path=str(track / "st"))
    daisy_nb.run_blockwise([task], progress=False, summary=False, log_dir=str(tmp_path / "daisy_logs"))
    g = groups_from_logs(tmp_path / "daisy_logs", "st").as_list()
    assert [(x["type"], x["count"]) for x in g] == [("IndexError", 2)]
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_LOG_DIR"}  # its default: ./daisy_logs
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "status", str(track)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert r.returncode == 1, r.stderr  # 2 blocks not done
    assert "failed, not done  2" in r.stdout
    assert "errors in the logs  2 block failure(s) of 1 kind(s)" in r.stdout
    assert "2 × IndexError: index" in r.stdout and "worker_" in r.stdout
    elsewhere = tmp_path / "elsewhere"  # no ./daisy_logs here: DAISY_NB_LOG_DIR names the directory
    elsewhere.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "status", str(track)],
        cwd=elsewhere,
        env=dict(env, DAISY_NB_LOG_DIR=str(tmp_path / "daisy_logs")),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    assert "errors in the logs  2 block failure(s) of 1 kind(s)" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "status", "--logs", str(tmp_path / "nope"), str(track)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--logs" in r.stderr


# -- structured errors (errors.WorkerError): grouped by their fields, no parsing -------------
def test_structured_errors_group_as_their_text_does():
    from daisy_nb.errors import ErrorGroups, WorkerError

    a, b = ErrorGroups("t"), ErrorGroups("t")
    for bid in (7, 91):
        msg = f"index {bid * 10} is out of bounds for axis 0 with size 1000"
        tb = f'Traceback (most recent call last):\n  File "x.py", line 3, in f\nIndexError: {msg}\n'
        err = WorkerError("IndexError", msg, tb, bid)
        a.add(err)
        b.add(err.text())
    ga, gb = a.as_list(), b.as_list()
    assert len(ga) == len(gb) == 1
    for k in ("type", "shape", "count", "first_block", "last_block", "traceback"):
        assert ga[0][k] == gb[0][k], k
    assert ga[0]["count"] == 2 and (ga[0]["first_block"], ga[0]["last_block"]) == (7, 91)


def test_structured_errors_need_no_naming_convention():
    """The text path finds an exception by its name's ending (Error, Exception...); a class named
    otherwise is a 'worker error' there, and its own name when sent structured."""
    from daisy_nb.errors import ErrorGroups, WorkerError

    class Boom(Exception):
        pass

    e = Boom("disk 3 is gone")
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nBoom: disk 3 is gone\n'
    g = ErrorGroups("t")
    g.add(WorkerError.from_exception(e, tb, 5))
    (only,) = g.as_list()
    assert (only["type"], only["message"], only["first_block"]) == ("Boom", "disk 3 is gone", 5)
    assert only["shape"] == "disk <n> is gone"
    assert only["traceback"].startswith("block 5 failed:\nTraceback")


def test_a_structured_worker_message_without_traceback():
    from daisy_nb.errors import ErrorGroups, WorkerError

    g = ErrorGroups("t")
    g.add(WorkerError("worker error", "daisy worker process exited with code 1"))
    (only,) = g.as_list()
    assert only["type"] == "worker error" and only["first_block"] is None
    assert only["traceback"] == "daisy worker process exited with code 1"


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_a_client_sends_its_failures_structured_and_they_group_as_sent(tmp_path, monkeypatch, no_leaks):
    """A real worker function's ``Client`` (a process, TCP): the failure frame carries the
    exception's type, message and traceback apart, so a class named as no convention expects and
    a message of two lines group as raised, where parsing the text would not; the recorded text
    (``last_worker_error``) is the one the client writes to its log."""
    monkeypatch.setenv("ERR_GONE", "3,9")
    monkeypatch.setenv("ERR_INDEX", "5")
    task = daisy_nb.Task(
        "net",
        total_roi=Roi((0,), (200,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=errfns.client_loop,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
    )
    logs = tmp_path / "logs"
    states = daisy_nb.run_blockwise([task], progress=False, summary=False, return_states=True, log_dir=str(logs))
    st = states["net"]
    assert (st.failed_count, st.completed_count, st.worker_failure_count) == (3, 17, 0)
    groups = {g["type"]: g for g in st.error_groups.as_list()}
    assert set(groups) == {"DiskGone", "IndexError"}
    gone = groups["DiskGone"]
    assert gone["count"] == 2 and {gone["first_block"], gone["last_block"]} == {3, 9}
    sent = f"disk {gone['first_block']} is gone\nsecond line: ask the admin"
    assert gone["message"] == sent and gone["shape"] == "disk <n> is gone second line: ask the admin"
    # what parsing the same text finds: neither the type nor the message as raised
    assert split_error(gone["traceback"])[:2] == ("error", "second line: ask the admin")
    assert gone["traceback"].startswith(f"block ('net', {gone['first_block']}) failed:\nTraceback")
    assert gone["traceback"].rstrip().endswith(f"DiskGone: {sent}")
    ie = groups["IndexError"]
    assert (ie["count"], ie["first_block"], ie["message"]) == (
        1,
        5,
        "index 5007 is out of bounds for axis 0 with size 1000",
    )
    # the recorded text as the client writes it to its log (block id as Block.block_id prints it)
    err = "".join(p.read_text() for p in (logs / "net").glob("*.err"))
    for text in (st.first_worker_error, st.last_worker_error):
        assert text.startswith("block ('net', ") and "Traceback (most recent call last):" in text
        assert text in err
    assert st.first_worker_error.startswith("block ('net', 3) failed:\n")
    assert st.last_worker_error.startswith("block ('net', 9) failed:\n")

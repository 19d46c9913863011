"""The dashboard page in a real browser: headless chromium renders it (``--dump-dom``
after the page's JavaScript ran) while a pipeline runs on worker processes.

Skipped only where no chromium is installed (``.ci/run`` installs Debian's).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.dashboard import Dashboard

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))
import dashfns  # noqa: E402

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = [
    pytest.mark.mp,
    pytest.mark.timeout(240),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium; .ci/run does)"),
]


def dump_dom(url: str, budget_ms: int = 2500, extra=()) -> str:
    """The DOM after the page ran ``budget_ms`` of (virtual) time; the browser is gone afterwards.
    ``extra``: more chromium switches."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *extra,
            "--dump-dom",
            url,
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=120)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # helpers of the browser, if any are left
            except ProcessLookupError:
                pass
            proc.wait()
    return out


class Page(HTMLParser):
    """What the test reads off the rendered page: per task its counts, the errors, the drawer."""

    def __init__(self, html: str):
        super().__init__()
        self.tasks: dict[str, dict[str, int]] = {}
        self.errors: list[tuple[str, str]] = []
        self.drawer_blocks: list[tuple[str, str]] = []
        self.attrs: dict[str, dict] = {}
        self.panels: dict[str, int] = {}
        self.text: list[str] = []
        self._task = None
        self._count = None
        self._in_tb = False
        self.tracebacks: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "") or ""
        if tag == "article" and "task" in cls.split():
            self._task = a.get("data-task")  # None in the page's <template>
            if self._task is not None:
                self.tasks[self._task] = {}
        if tag == "span" and cls == "count":
            self._count = a.get("data-k")
        if tag == "li" and "error" in cls.split():
            self.errors.append((a.get("data-task"), a.get("data-block-id")))
        if tag == "div" and cls == "blk":
            self.drawer_blocks.append((a.get("data-block-id"), a.get("data-status")))
        if tag == "pre" and "tb" in cls.split():
            self._in_tb = True
            self.tracebacks.append("")
        if "id" in a:
            self.attrs[a["id"]] = a
        if tag == "body":
            self.attrs["body"] = a
        if tag == "canvas" and "data-panel" in a and self._task is not None:
            self.panels[self._task] = self.panels.get(self._task, 0) + 1

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_tb = False

    def handle_data(self, data):
        if self._count is not None and self._task is not None:
            self.tasks[self._task][self._count] = int(data.replace(",", ""))
            self._count = None
        if self._in_tb:
            self.tracebacks[-1] += data
        self.text.append(data)


def _tasks():
    a = daisy_nb.Task(
        "segment",
        total_roi=Roi((0, 0, 0), (40, 100, 100)),
        read_roi=Roi((0, 0, 0), (10, 10, 10)),
        write_roi=Roi((0, 0, 0), (10, 10, 10)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_workers=2,
        max_retries=0,
    )
    b = daisy_nb.Task(
        "relabel",
        total_roi=Roi((0,), (3000,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
    )
    return [a, b]


def test_page_of_a_running_pipeline(tmp_path, monkeypatch):
    flag = tmp_path / "slow"
    flag.write_text("")
    monkeypatch.setenv("DASH_SLOW", str(flag))
    monkeypatch.setenv("DASH_SLEEP", "0.02")
    gate = tmp_path / "gate"
    # relabel's blocks from 150 on wait for the gate, opened after the first page load, so the second
    # load sees more done; its last block waits for the test, so the run outlasts every load
    monkeypatch.setenv("DASH_GATE", f"relabel:150:{gate}")
    monkeypatch.setenv("DASH_HOLD", "relabel:299")
    monkeypatch.setenv("DASH_FAIL", "3")  # block 3 of both tasks fails (3 is the first 1-D root after 0..2)
    pages = {}
    with Dashboard(quiet=True) as dash:

        def browse():
            try:
                import json
                import urllib.request

                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # wait until block 3 has failed and blocks are done
                    with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                        s = json.load(r)
                    if s["tasks"] and all(t["completed"] > 0 for t in s["tasks"]) and s["errors"]:
                        break
                    time.sleep(0.2)
                pages["first"] = Page(dump_dom(dash.url))
                gate.write_text("")
                while time.monotonic() < deadline:  # gated blocks (none can be on the first page) have run
                    with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                        now = json.load(r)
                    if any(t["task_id"] == "relabel" and t["completed"] > 160 for t in now["tasks"]):
                        break
                    time.sleep(0.1)
                pages["second"] = Page(dump_dom(dash.url))
                pages["block"] = Page(dump_dom(dash.url + "#block=relabel:3", 3500))
            finally:
                flag.unlink()

        th = threading.Thread(target=browse)
        th.start()
        states = daisy_nb.run_blockwise(_tasks(), dashboard=dash, return_states=True, progress=False, summary=False)
        th.join()
        pages["final"] = Page(dump_dom(dash.url))

    first, second, block, final = pages["first"], pages["second"], pages["block"], pages["final"]
    # the task ids and their counts are on the page, and they grew between two loads
    assert set(first.tasks) == {"segment", "relabel"}
    done1 = sum(t.get("completed", 0) for t in first.tasks.values())
    done2 = sum(t.get("completed", 0) for t in second.tasks.values())
    assert 0 < done1 < done2, (first.tasks, second.tasks)
    assert first.attrs["run-status"].get("data-finished") == "false"
    # the failed block is listed, and its drawer shows the block, its status and traceback
    assert ("relabel", "3") in second.errors or ("segment", "3") in second.errors, second.errors
    assert ("3", "failed") in block.drawer_blocks, block.drawer_blocks
    assert any("dashboard test failure in block 3" in tb for tb in block.tracebacks)
    assert any("offset (30), shape (10)" in t for t in block.text)  # relabel block 3 writes [30, 40)
    # the pictures were drawn: segment (3-D, 4 slices of 10 x 10 blocks) as 4 panels, relabel as one strip
    assert second.attrs["body"].get("data-pictures") == "2"
    assert second.panels == {"segment": 4, "relabel": 1}, second.panels
    # at the end the page shows the final TaskStates
    assert final.attrs["run-status"].get("data-finished") == "true"
    for tid, st in states.items():
        shown = final.tasks[tid]
        assert shown["completed"] == st.completed_count
        assert shown["failed"] == st.failed_count == 1
        assert shown["total"] == st.total_block_count
        assert shown["remaining"] == 0
    # each task card says what its workers were held, and how much of it ran blocks
    held = [t for t in final.text if " held, " in t and t.endswith("% busy")]
    assert len(held) == 2, held


def test_page_with_token_on_another_address():
    t = daisy_nb.Task(
        "tok",
        total_roi=Roi((0,), (200,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        read_write_conflict=False,
    )
    with Dashboard(host="127.0.0.2", quiet=True) as dash:
        daisy_nb.run_blockwise([t], multiprocessing=False, dashboard=dash, progress=False, summary=False)
        ok = Page(dump_dom(dash.url))
        assert ok.tasks == {"tok": ok.tasks["tok"]} and ok.tasks["tok"]["completed"] == 20
        refused = dump_dom(f"http://127.0.0.2:{dash.port}/")
        assert "forbidden" in refused and 'data-task="tok"' not in refused

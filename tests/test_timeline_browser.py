"""The worker timeline, the errors-by-kind panel and the run report in a real browser
(headless chromium, as tests/test_dashboard_browser.py). The report is opened from a
``file://`` URL with the network off (every host unresolvable, a dead proxy).
"""

import json
import sys
import threading
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from funlib.geometry import Roi
from test_dashboard_browser import CHROMIUM, dump_dom
from test_timeline import external_refs

import daisy_nb
from daisy_nb.dashboard import Dashboard

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))
import dashfns  # noqa: E402

pytestmark = [
    pytest.mark.mp,
    pytest.mark.timeout(240),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium; .ci/run does)"),
]
NO_NETWORK = [
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


class Panels(HTMLParser):
    """The timeline rows (data-* of .tl-row), the error groups (.grp) and the task counts."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: list[dict] = []
        self.groups: list[dict] = []
        self.body: dict = {}
        self.ids: dict = {}
        self.counts: dict = {}
        self._task = None
        self._count = None
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "div" and "tl-row" in cls:
            self.rows.append(a)
        if tag == "div" and "grp" in cls:
            self.groups.append(a)
        if tag == "body":
            self.body = a
        if tag == "article" and "task" in cls:
            self._task = a.get("data-task")
        if tag == "span" and cls == ["count"] and self._task:
            self._count = a.get("data-k")
        if "id" in a:
            self.ids[a["id"]] = a

    def handle_data(self, data):
        if self._count is not None:
            self.counts.setdefault(self._task, {})[self._count] = int(data.replace(",", ""))
            self._count = None
        self.text.append(data)


def _task(n, **kw):
    return daisy_nb.Task(
        "tlb",
        total_roi=Roi((0,), (n * 10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_retries=0,
        **kw,
    )


def test_live_timeline_and_errors_by_kind(tmp_path, monkeypatch):
    flag = tmp_path / "slow"
    flag.write_text("")
    monkeypatch.setenv("DASH_SLOW", str(flag))
    monkeypatch.setenv("DASH_SLEEP", "0.02")
    monkeypatch.setenv("DASH_HOLD", "tlb:599")  # the last block waits for the test: the run outlasts the load
    monkeypatch.setenv("DASH_FAIL", "3,11,12")
    pages = {}
    with Dashboard(quiet=True) as dash:

        def browse():
            try:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # three failures grouped, blocks done
                    with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                        s = json.load(r)
                    if s["tasks"] and s["tasks"][0]["completed"] > 20 and s["tasks"][0]["failed"] == 3:
                        break
                    time.sleep(0.2)
                pages["running"] = Panels(dump_dom(dash.url, 3000))
            finally:
                flag.unlink()

        th = threading.Thread(target=browse)
        th.start()
        states = daisy_nb.run_blockwise(
            [_task(600, max_workers=2)], dashboard=dash, return_states=True, progress=False, summary=False
        )
        th.join()
        pages["final"] = Panels(dump_dom(dash.url, 3000))
    run, final = pages["running"], pages["final"]
    # one row per worker that ran: running (or idle between batches) ones while the run goes on
    assert len(run.rows) >= 2, run.rows
    assert {r["data-state"] for r in run.rows} & {"running", "idle"}, run.rows
    assert sum(int(r["data-bars"]) for r in run.rows) > 0
    assert sum(r["data-state"] == "lost" for r in run.rows) >= 1  # the workers whose block raised
    # at the end: every worker has exited or is lost, their bars count every block run
    st = states["tlb"]
    assert len(final.rows) == st.worker_start_count
    assert {r["data-state"] for r in final.rows} <= {"exited", "lost"}
    assert sum(int(r["data-blocks"]) for r in final.rows) == 600
    # the three ValueErrors are one kind; the workers' exits another
    kinds = {g["data-type"]: int(g["data-count"]) for g in final.groups}
    assert kinds.get("ValueError") == 3, final.groups
    assert kinds.get("worker error") == 3
    assert "dashboard test failure in block 3" in "".join(final.text)


def test_report_renders_from_a_file_url_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("DASH_FAIL", "5")
    path = tmp_path / "run.html"
    states = daisy_nb.run_blockwise(
        [_task(400, max_workers=2)], report=str(path), return_states=True, progress=False, summary=False
    )
    html = path.read_text()
    assert external_refs(html) == []
    page = Panels(dump_dom(path.as_uri(), 3000, extra=NO_NETWORK))
    assert page.body.get("data-report") == "ready", page.body
    assert page.counts["tlb"]["completed"] == states["tlb"].completed_count == 399
    assert page.counts["tlb"]["failed"] == 1
    assert page.body.get("data-pictures") == "1"
    assert len(page.rows) == states["tlb"].worker_start_count and sum(int(r["data-blocks"]) for r in page.rows) == 400
    assert {g["data-type"] for g in page.groups} == {"ValueError", "worker error"}
    assert page.ids["run-status"].get("data-finished") == "true"
    assert path.stat().st_size < 200_000

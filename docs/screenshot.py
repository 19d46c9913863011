"""Take the README's dashboard screenshot (docs/dashboard.png) with headless chromium.

    python docs/screenshot.py [OUT.png]

A two-task pipeline (a 3-D task with conflict levels and a 1-D one downstream of
nothing), 20 ms blocks, three failing blocks of the 1-D task; the picture is taken mid-run, once
both tasks have progress, then shrunk to a palette PNG (Pillow) to stay small.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests" / "workers"))


def main(out: str) -> None:
    from funlib.geometry import Roi

    import daisy_nb
    from daisy_nb.dashboard import Dashboard

    tmp = Path(tempfile.mkdtemp(prefix="dnb_shot_"))
    (tmp / "slow").write_text("")
    os.environ.update(DASH_SLOW=str(tmp / "slow"), DASH_SLEEP="0.02", DASH_FAIL="13,57,240")
    import dashfns

    seg = daisy_nb.Task(
        "segment",
        total_roi=Roi((0, 0, 0), (60, 160, 160)),
        read_roi=Roi((0, 0, 0), (30, 30, 30)),
        write_roi=Roi((10, 10, 10), (10, 10, 10)),
        process_function=dashfns.work,
        read_write_conflict=True,
        max_workers=3,
        max_retries=0,
    )
    rel = daisy_nb.Task(
        "relabel",
        total_roi=Roi((0,), (6000,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
    )
    dash = Dashboard(quiet=True).start()
    th = threading.Thread(
        target=daisy_nb.run_blockwise,
        args=([seg, rel],),
        kwargs={"dashboard": dash, "progress": False, "summary": False, "log_dir": str(tmp / "logs")},
    )
    th.start()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                s = json.load(r)
            t = {x["task_id"]: x for x in s["tasks"]}
            if t and t["segment"]["completed"] > 0.4 * t["segment"]["total"] and t["relabel"]["failed"] >= 2:
                break
            time.sleep(0.3)
        prof = tmp / "profile"
        raw = tmp / "raw.png"
        subprocess.run(
            [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={prof}", "--virtual-time-budget=5000",
             "--window-size=1280,1390", "--hide-scrollbars", f"--screenshot={raw}", dash.url],
            stderr=subprocess.DEVNULL, check=True, timeout=300,
        )  # fmt: skip
        from PIL import Image

        im = Image.open(raw).convert("RGB")
        im.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE).save(out, optimize=True)
        print(f"{out}: {os.path.getsize(out) / 1024:.0f} KiB")
    finally:
        (tmp / "slow").unlink(missing_ok=True)
        th.join()
        dash.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(HERE / "dashboard.png"))

"""Block functions of tests/test_tracking_grow.py (imported by worker processes: keep light).

Each call appends a line to ``$DAISY_NB_TEST_OUT/<task>_<write begin>``; a block whose
write begin is listed in ``$DAISY_NB_GROW_FAIL`` (``"x,y;x,y"``) fails (status FAILED, 3:
a serial run would raise an exception into the caller).
"""

import os


def record(block):
    begin = ",".join(str(int(v)) for v in block.write_roi.offset)
    with open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"{block.task_id}_{begin}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    if begin in os.environ.get("DAISY_NB_GROW_FAIL", "").split(";"):
        block.status = 3  # BlockStatus.FAILED

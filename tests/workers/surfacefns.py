"""Block functions for tests/test_daisy_surface.py (imported by worker processes: keep light)."""

import os


def report_via_logging(block):
    """Use daisy.logging's worker-side calls: write through the slot files, emit a failure."""
    import daisy_nb.logging as dlog

    sid = block.block_id[1]
    files = dlog.current_slot_files()
    with open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"slotfiles_{sid}"), "w") as f:
        f.write(str(len(files)) if files is not None else "none")
    if files is not None:
        files[0].write(f"slot out of block {sid}\n")
        files[0].flush()
    dlog.emit_failure(f"emitted failure of block {sid}")

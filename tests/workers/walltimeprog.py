"""A worker program (a "cluster job") for ``tests/test_walltime.py``: a ``daisy_nb.Client`` loop
whose blocks take ``BLOCK_SECS`` each. Its end, if known, is ``JOB_END`` (``Client(end_time=)``)
or ``SLURM_JOB_END_TIME`` (read by the Client). Every block leaves ``done_<block>`` (the pid that
ran it and when it finished); the program leaves ``ended_<pid>`` (when, blocks it ran, its end
time or ``None``) when its loop ends."""

import os
import time

import daisy_nb

OUT = os.environ["DAISY_NB_TEST_OUT"]


def touch(name, text):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text)


def main():
    end = os.environ.get("JOB_END")
    client = daisy_nb.Client(end_time=None if end is None else float(end))
    secs = float(os.environ["BLOCK_SECS"])
    ran = 0
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            time.sleep(secs)  # the block's work
            touch(f"done_{block.block_id[1]}", f"{os.getpid()} {time.time()}\n")
            ran += 1
    touch(f"ended_{os.getpid()}", f"{time.time()} {ran} {client.end_time}\n")


if __name__ == "__main__":
    main()

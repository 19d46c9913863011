"""A detached worker program (a "cluster job"): ``python cluster_prog.py OUT MODE BLOCK_SECS``.

Its environment holds only PATH and DAISY_CONTEXT; daisy_nb is found through the
interpreter's own installation. Writes ``prog_<pid>`` (what it saw) and, when its loop
ends, ``end_<pid>``; blocks leave ``done_*`` files as in blockfns (extra "cluster").
"""

import os
import signal
import socket
import sys
import time

env_keys = sorted(os.environ)  # before this program adds its own
out, mode, block_secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
os.environ["DAISY_NB_TEST_OUT"] = out
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blockfns  # noqa: E402

import daisy_nb  # noqa: E402

ctx = daisy_nb.Context.from_env()
host, port = ctx["hostname"], int(ctx["port"])
loopback = "n/a"
if host != "127.0.0.1":  # is the scheduler also reachable on 127.0.0.1? (it must not be)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        loopback = "accepted"
    except ConnectionRefusedError:
        loopback = "refused"
with open(os.path.join(out, f"prog_{os.getpid()}"), "w") as f:
    f.write(f"{host} {port} {loopback} {env_keys}\n")

client = daisy_nb.Client()
n = 0
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        k = blockfns.attempt(block)
        if mode == "stop_on_3" and block.spatial_id == 3 and k == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # vanish while holding the block
        time.sleep(block_secs)
        blockfns.done(block, extra="cluster")
        n += 1
with open(os.path.join(out, f".end_{os.getpid()}.tmp"), "w") as f:  # renamed into place: never read half written
    f.write(f"{n} connected={client.connected}\n")
os.replace(os.path.join(out, f".end_{os.getpid()}.tmp"), os.path.join(out, f"end_{os.getpid()}"))

"""A "job on another machine": ``python netprog.py OUT MODE``, started by ``netfns``.

Its environment holds only PATH and DAISY_CONTEXT. It writes ``prog_<pid>.json`` (what
it saw) and ``end_<pid>`` when its loop ends; each block it runs leaves a ``blk_*`` file.

* ``remote``: another machine cannot use a loopback address, so this job refuses one
  (exit 3) and connects only to the advertised address; it records which addresses the
  scheduler's port listens on.
* ``local_only``: records the listening addresses and whether the scheduler's port
  answers on this machine's non-loopback addresses (it must not), then runs its loop.
* ``late``: a job submitted fire-and-forget: connects once its worker function is gone.
* ``unreachable``: a job that cannot reach the scheduler: it tries a port nothing
  listens on (as a firewall or a wrong address would make it), so its loop ends at once.
"""

import ipaddress
import json
import os
import socket
import sys
import time
import urllib.parse

out, mode = sys.argv[1], sys.argv[2]
# the daisy_nb of this checkout, as a job's environment would have the driver's release (it has no PYTHONPATH)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import psutil  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.runtime.net import address as net_address  # noqa: E402


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return any(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def listening(port):
    return sorted(
        c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    )


def answers(ip, port):
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


ctx = daisy_nb.Context.from_env()
host, port = ctx["hostname"], int(ctx["port"])
seen = {"host": host, "port": port, "task_id": ctx["task_id"], "worker_id": ctx["worker_id"]}
seen["listening"] = listening(port)
if mode == "remote" and is_loopback(host):
    seen["refused"] = "loopback address: another machine cannot use it"
    with open(os.path.join(out, f"prog_{os.getpid()}.json"), "w") as f:
        json.dump(seen, f)
    sys.exit(3)
if mode == "local_only":
    seen["answers"] = {ip: answers(ip, port) for ip, _ in net_address.candidate_addresses()}
if mode in ("unreachable", "unreachable_fails"):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]  # bound, never listening: connections to it are refused
    ctx["port"] = closed
    client = daisy_nb.Client(ctx)
    s.close()
else:
    client = daisy_nb.Client(ctx)
if client.connected:
    seen["peer"] = client._conn.sock.getpeername()[0]
with open(os.path.join(out, f"prog_{os.getpid()}.json"), "w") as f:
    json.dump(seen, f)
if mode == "unreachable_fails":
    sys.exit(2)  # a job script that treats "no scheduler" as an error
n = 0
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        tag = urllib.parse.quote(block.task_id, safe="")
        with open(os.path.join(out, f"blk_{tag}_{block.spatial_id}"), "a") as f:
            f.write(f"{os.getpid()}\n")
        if mode == "late":
            time.sleep(0.05)
        n += 1
with open(os.path.join(out, f".end_{os.getpid()}.tmp"), "w") as f:  # renamed into place: never read half written
    f.write(f"{n} connected={client.connected}\n")
os.replace(os.path.join(out, f".end_{os.getpid()}.tmp"), os.path.join(out, f"end_{os.getpid()}"))

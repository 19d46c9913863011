"""Thousands of ``Client`` connections to one daisy_nb scheduler: a load generator (issue 21).

    python benchmarks/bench_connections.py [--connections 500,2000] [--procs 4] [--blocks N]
        [--idle-secs S] [--storm-threads T] [--sources S]

A task whose 0-argument worker function (``bench_cluster.submit``) starts a job
program, as a cluster job; here each job is a *load generator* process that opens
``connections / procs`` TCP connections to the scheduler from one process: its
handshakes in a thread pool (``net_transport.connect`` is blocking), then every socket
non-blocking under one selector (no thread per connection). Each connection speaks
the worker protocol of ``daisy_nb.Client`` (hello with the job's worker id, ``A``
acquire, ``R`` release and acquire, ``Q`` goodbye, ``P`` heartbeats) with the frame and message
helpers of ``daisy_nb.runtime.net`` (transport, liveness) and ``daisy_nb.runtime.client``, through
:class:`Wire`, the one place that knows the wire format (the hardening issue's
per-frame MAC and sequence numbers change only it). Three phases, each started by
a barrier across the generator processes (files in a shared folder):

The connections come from ``--sources`` loopback addresses (``127.1.x.y``, 64 by
default), each standing in for one machine of a cluster: the listener keeps its
handshake slots per peer address, so 2,000 connections from 127.0.0.1 alone are a
flood from one machine (``--sources 0`` measures that).

1. **storm**: every connection of every process connects at once (``storm_threads``
   handshakes per process in flight, by default all of them); the time from the
   barrier to the last handshake done, and the connections that failed (and why:
   a real ``Client`` that fails here ends its job, thinking the run is over);
2. **rest**: all connected (the handshakes that failed in the storm are retried first,
   8 at a time per process, unless ``--no-reconnect``), hello said, none asking for work; heartbeats both ways
   (``DAISY_NB_HEARTBEAT_SECS``, 5 s by default) for ``idle_secs``: the scheduler's
   CPU per second at rest, its threads;
3. **blocks**: every connection asks (``A``) and releases each block at once, blocks
   that take no time (as the real client, a release asks for the next block, so ``A``
   goes out again only where no request is unanswered); blocks/s
   and the scheduler's CPU per block while every connection is busy (from the
   barrier to the first ``N``, "no more work").

The scheduler is a ``run_blockwise`` in its own interpreter (``_util.spawn``); a
sampler thread there (``bench_server_cpu.Sampler``, ``getrusage`` every 20 ms) gives
its CPU inside each phase's window. Both sides raise ``RLIMIT_NOFILE`` to the hard
limit. Connections go to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import resource
import selectors
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECONNECT_ROUNDS = 5  # after the storm (--reconnect): retries of the handshakes that failed
RECONNECT_THREADS = 8  # handshakes in flight per process while retrying


def raise_nofile(need: int, soft: int = 0) -> int:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit (or to ``soft``); returns it.

    A ``RuntimeError`` if the hard limit is below ``need``."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < need:
        raise RuntimeError(f"RLIMIT_NOFILE hard limit {hard} < {need} file descriptors needed")
    want = min(soft, hard) if soft else hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def source_address(i: int, sources: int) -> str | None:
    """The loopback address connection ``i`` comes from (one of ``sources``: machines of a cluster,
    each its own peer for the listener's handshake slots), or None (all from 127.0.0.1)."""
    if sources <= 0:
        return None
    s = i % sources
    return f"127.1.{s // 200}.{s % 200 + 1}"


# ------------------------------------------------------------------------- the wire
class Wire:
    """One generator connection: handshake, frames out, frames in.

    The only place that knows how daisy_nb's worker protocol is put on the wire: the
    handshake is ``net_transport.connect`` (the real client's: it returns a ``Session``, the socket
    and its frame codec with the client's keys and sequence numbers), frames are sealed,
    verified and split by ``net_transport.ServerConn`` over that codec (its ``send_bytes``/
    ``recv_frames`` work for either end, on a non-blocking socket) and the messages are
    ``client.py``'s.
    """

    __slots__ = ("asked", "conn", "done", "last_send", "released")

    def __init__(self, session):
        from daisy_nb.runtime.net import transport as net_transport

        sock = session.sock
        self.conn = net_transport.ServerConn(sock, sock.getpeername(), session.codec)  # sets it non-blocking
        self.asked = False  # an A is on its way, unanswered
        self.done = False  # N received: the goodbye was sent
        self.released = 0
        self.last_send = time.monotonic()

    @classmethod
    def connect(cls, ctx, timeouts, source: str | None = None) -> Wire:
        from daisy_nb.runtime.net import transport as net_transport

        return cls(
            net_transport.connect(ctx["hostname"], int(ctx["port"]), bytes.fromhex(ctx["authkey"]), timeouts, source)
        )

    def fileno(self) -> int:
        return self.conn.fileno()

    def send(self, payload: bytes) -> None:
        self.conn.send_bytes(payload)
        self.last_send = time.monotonic()

    def frames(self) -> list[bytes]:
        got = self.conn.recv_frames()
        if self.conn.broken is not None:  # a frame failed its check: never on loopback, so say it
            raise ConnectionError(f"frame integrity: {self.conn.broken}")
        return got

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------- generator process
def generate(lib: str) -> None:
    """A generator process (started by ``bench_cluster.submit`` as its job): see the docstring."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, HERE)
    import bench_cluster as bc

    from daisy_nb.runtime.context import Context
    from daisy_nb.runtime.net import liveness as net_liveness
    from daisy_nb.runtime.net import wire

    folder = os.environ["BENCH_CONN_DIR"]
    procs = int(os.environ["BENCH_CONN_PROCS"])
    k = int(os.environ["BENCH_CONN_PER_PROC"])
    threads = int(os.environ.get("BENCH_CONN_STORM_THREADS") or k)
    idle = float(os.environ["BENCH_CONN_IDLE_SECS"])
    reconnect = os.environ.get("BENCH_CONN_RECONNECT") == "1"
    raise_nofile(k + 64)
    ctx = Context.from_env()
    timeouts = net_liveness.liveness(ctx)
    hello = wire.encode_hello(ctx["task_id"], int(ctx["worker_id"]))
    out: dict = {"pid": os.getpid(), "k": k}

    # 1. storm: all at once
    bc.barrier_wait(folder, procs, "storm")
    errors: dict[str, int] = {}

    sources = int(os.environ.get("BENCH_CONN_SOURCES") or 0)
    first = int(ctx["worker_id"]) * k  # this process's connections, numbered across the processes

    def one(i):
        t = time.monotonic()
        try:
            return Wire.connect(ctx, timeouts, source_address(first + i, sources)), time.monotonic() - t
        except Exception as e:  # NotOurRun (dropped during the handshake), refused, timed out
            return f"{type(e).__name__}: {e}", time.monotonic() - t

    out["storm_start"] = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(threads, k)) as ex:
        results = list(ex.map(one, range(k)))
    out["storm_end"] = time.monotonic()
    wires = []
    for r, _secs in results:
        if isinstance(r, Wire):
            wires.append(r)
        else:
            errors[r] = errors.get(r, 0) + 1
    out["connected"] = len(wires)
    out["errors"] = errors
    out["handshake_secs_max"] = max((s for _, s in results), default=0.0)
    if reconnect:  # so that the later phases have every connection: a few handshakes at a time
        for _ in range(RECONNECT_ROUNDS):
            missing = k - len(wires)
            if not missing:
                break
            with ThreadPoolExecutor(max_workers=RECONNECT_THREADS) as ex:
                wires += [r for r, _ in ex.map(one, range(missing)) if isinstance(r, Wire)]
    out["connected_after_retries"] = len(wires)
    sel = selectors.DefaultSelector()
    for w in wires:
        w.send(hello)
        sel.register(w, selectors.EVENT_READ, w)
    dropped = {"rest": 0, "blocks": 0}
    frames_in = {"P": 0}

    def pump(until, phase: str, work: bool) -> None:
        """Serve every connection until ``until()``: read frames, answer blocks, heartbeats."""
        next_check = 0.0
        while True:
            now = time.monotonic()
            if now >= next_check:
                if until():
                    return
                next_check = now + 0.1
                for w in wires:  # heartbeats, as the client's background thread sends them
                    if not w.done and now - w.last_send >= timeouts["heartbeat"]:
                        try:
                            w.send(wire.encode_ping())
                        except OSError:
                            pass
            for key, _ in sel.select(0.1):
                w = key.data
                try:
                    msgs = w.frames()
                except (EOFError, OSError):
                    sel.unregister(w)
                    wires.remove(w)
                    w.close()
                    if not w.done:
                        dropped[phase] += 1
                    continue
                try:
                    for m in msgs:
                        kind = m[:1]
                        if kind == wire.Kind.BLOCK:  # a block that takes no time: released at once
                            index = wire.index_of_block(m)
                            w.send(wire.encode_release(index, 2))  # a release asks for the next block too
                            w.asked = True
                            w.released += 1
                            released.append(time.monotonic())
                        elif kind == wire.Kind.NO_MORE:
                            w.asked = False
                            if not w.done:
                                w.done = True
                                first_n.append(time.monotonic())
                                w.send(wire.encode_goodbye())  # the scheduler closes: EOF above
                        elif kind == wire.Kind.PING:
                            frames_in["P"] += 1
                    if work and not w.done and not w.asked:
                        w.send(wire.encode_acquire())
                        w.asked = True
                except OSError:
                    pass

    def meet(name: str, phase: str) -> None:
        """A barrier across the generator processes, serving the connections while it waits."""
        bc.barrier_arrive(folder, name)
        pump(lambda: bc.barrier_passed(folder, procs, name), phase, False)

    released: list[float] = []
    first_n: list[float] = []
    # 2. at rest: connected, nobody asks
    meet("storm_done", "rest")
    out["rest_start"] = time.monotonic()
    t_rest_end = out["rest_start"] + idle
    pump(lambda: time.monotonic() >= t_rest_end, "rest", False)
    out["rest_end"] = time.monotonic()
    out["pings_at_rest"] = frames_in["P"]
    # 3. blocks: everyone asks
    meet("blocks", "rest")
    out["blocks_start"] = time.monotonic()
    for w in wires:
        try:
            w.send(wire.encode_acquire())
            w.asked = True
        except OSError:
            pass
    pump(lambda: not wires, "blocks", True)
    out["first_n"] = min(first_n, default=None)
    out["released_times"] = released
    out["released"] = len(released)
    out["dropped"] = dropped
    import json

    path = os.path.join(folder, f"gen.{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------- scheduler
def child(
    conns: int, procs: int, blocks: int, idle: float, storm_threads: int, reconnect: bool, nofile: int, sources: int
) -> dict:
    import json
    import shutil
    import tempfile

    import _util

    sys.path.insert(0, HERE)
    import bench_cluster
    from bench_server_cpu import Sampler

    _util.warm_daisy_nb()
    import daisy_nb as daisy
    from daisy_nb import Roi

    nofile = raise_nofile(0 if nofile else conns + 256, nofile)
    folder = tempfile.mkdtemp(prefix="bench_connections.")
    os.environ.update(
        BENCH_CLUSTER_LIB="daisy_nb",
        BENCH_CLUSTER_PROGRAM=os.path.abspath(__file__),
        BENCH_CONN_DIR=folder,
        BENCH_CONN_PROCS=str(procs),
        BENCH_CONN_PER_PROC=str(conns // procs),
        BENCH_CONN_STORM_THREADS=str(storm_threads or ""),
        BENCH_CONN_SOURCES=str(sources),
        BENCH_CONN_IDLE_SECS=repr(idle),
        BENCH_CONN_RECONNECT="1" if reconnect else "0",
    )
    task = daisy.Task(
        "conns",
        Roi((0,), (blocks,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=bench_cluster.submit,
        read_write_conflict=False,
        max_workers=procs,
        max_retries=0,
        tracking_path=False,
    )
    t0 = time.perf_counter()
    with Sampler() as sampler:
        states = daisy.run_blockwise(task, progress=False, summary=False, return_states=True, host="127.0.0.1")
    secs = time.perf_counter() - t0
    gens = []
    for name in os.listdir(folder):
        if name.startswith("gen.") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                gens.append(json.load(f))
    shutil.rmtree(folder, ignore_errors=True)
    st = states["conns"]
    out: dict = {
        "conns": conns,
        "procs": procs,
        "blocks": blocks,
        "completed": st.completed_count,
        "failed": st.failed_count,
        "secs": secs,
        "nofile": nofile,
        "gens": len(gens),
        "load": os.getloadavg()[0],
    }
    if not gens:
        return out
    errors: dict[str, int] = {}
    for g in gens:
        for k, v in g["errors"].items():
            errors[k] = errors.get(k, 0) + v
    out.update(
        storm_secs=max(g["storm_end"] for g in gens) - min(g["storm_start"] for g in gens),
        handshake_max=max(g["handshake_secs_max"] for g in gens),
        connected=sum(g["connected"] for g in gens),
        connected_later=sum(g["connected_after_retries"] for g in gens),
        errors=errors,
        dropped_at_rest=sum(g["dropped"]["rest"] for g in gens),
        dropped_in_blocks=sum(g["dropped"]["blocks"] for g in gens),
        pings_at_rest=sum(g["pings_at_rest"] for g in gens),
    )
    a, b = min(g["storm_start"] for g in gens), max(g["storm_end"] for g in gens)
    out["storm_cpu"] = sampler.cpu_at(b) - sampler.cpu_at(a)
    a, b = max(g["rest_start"] for g in gens), min(g["rest_end"] for g in gens)
    if b > a:
        out["rest_secs"] = b - a
        out["rest_cpu_per_s"] = (sampler.cpu_at(b) - sampler.cpu_at(a)) / (b - a)
        out["rest_threads"] = max((n for t, _, n in sampler.samples if a <= t <= b), default=1) - 1  # less the sampler
    a = max(g["blocks_start"] for g in gens)
    ends = [g["first_n"] for g in gens if g["first_n"] is not None]
    b = min(ends) if ends else max(max(g["released_times"], default=a) for g in gens)
    n = sum(1 for g in gens for t in g["released_times"] if a < t <= b)
    if b > a and n:
        out.update(blocks_secs=b - a, blocks_in_window=n, blocks_cpu=sampler.cpu_at(b) - sampler.cpu_at(a))
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--job":  # a generator process
        generate(sys.argv[2])
        return
    import argparse

    sys.path.insert(0, HERE)
    import _util

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", default="500,2000", help="connections per run, comma-separated")
    ap.add_argument("--procs", type=int, default=4, help="generator processes (each a job of the task)")
    ap.add_argument("--blocks", type=int, default=40000, help="zero-time blocks of the task")
    ap.add_argument("--idle-secs", type=float, default=12.0, help="seconds at rest (all connected, none asking)")
    ap.add_argument("--storm-threads", type=int, default=0, help="handshakes in flight per process (0: all)")
    ap.add_argument(
        "--sources",
        type=int,
        default=64,
        help="loopback addresses the connections come from, as machines of a cluster (127.1.x.y; 0: all from 127.0.0.1)",
    )
    ap.add_argument(
        "--no-reconnect",
        action="store_true",
        help="do not retry the handshakes that failed in the storm (the later phases run with fewer connections)",
    )
    ap.add_argument(
        "--scheduler-nofile",
        type=int,
        default=0,
        help="the scheduler's soft RLIMIT_NOFILE (default: raised to the hard limit; 1024 is a common default)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 40 connections from 2 processes, 5,000 blocks")
    ap.add_argument("--worker", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.connections, args.procs, args.blocks, args.idle_secs = "40", 2, 5000, 2.0
    if args.worker:
        c, p, b, i, t, rc, nf, src = args.worker
        _util.emit(child(int(c), int(p), int(b), float(i), int(t), rc == "1", int(nf), int(src)))
        return
    note = _util.machine_note()
    bc = _util.as_installed()
    if bc:
        note += "; " + bc
    rows = []
    for conns in [int(x) for x in args.connections.split(",") if x]:
        r = _util.spawn(
            sys.executable,
            os.path.abspath(__file__),
            [
                conns,
                args.procs,
                args.blocks,
                args.idle_secs,
                args.storm_threads,
                int(not args.no_reconnect),
                args.scheduler_nofile,
                args.sources,
            ],
        )
        print(f"  {conns} connections: {r}", file=sys.stderr, flush=True)
        rows.append(_row(r))
    print(
        f"\nload generator: {args.procs} processes, one selector each, from "
        f"{f'{args.sources} loopback addresses' if args.sources else '127.0.0.1'}, "
        f"against one daisy_nb scheduler on 127.0.0.1; "
        f"{args.blocks:,} zero-time blocks; {args.idle_secs:g} s at rest; scheduler RLIMIT_NOFILE "
        f"{rows_nofile(args.scheduler_nofile)}\n{note}\n"
    )
    print(
        _util.table(
            [
                "connections",
                "storm: all handshakes done",
                "slowest handshake",
                "scheduler CPU in the storm",
                "failed (why)",
                "connected after retries",
                "dropped later",
                "CPU at rest",
                "threads",
                "blocks/s (all asking)",
                "CPU per block",
                "blocks done",
            ],
            rows,
        )
    )


def rows_nofile(soft: int) -> str:
    return str(soft) if soft else f"raised to the hard limit ({resource.getrlimit(resource.RLIMIT_NOFILE)[1]})"


def _row(r: dict) -> list:
    if "storm_secs" not in r:
        return [r["conns"], "no generator reported", "", "", "", "", "", "", "", r["completed"]]
    failed = r["conns"] // r["procs"] * r["procs"] - r["connected"]
    why = "; ".join(f"{v}x {k}" for k, v in sorted(r["errors"].items(), key=lambda kv: -kv[1]))
    rate = cpu = "n/a"
    if "blocks_secs" in r:
        rate = f"{r['blocks_in_window'] / r['blocks_secs']:,.0f}"
        cpu = f"{r['blocks_cpu'] * 1e6 / r['blocks_in_window']:.0f} µs"
    return [
        r["conns"],
        f"{r['storm_secs']:.2f} s",
        f"{r['handshake_max']:.2f} s",
        f"{r['storm_cpu']:.2f} s",
        f"{failed}" + (f" ({why})" if why else ""),
        r["connected_later"],
        f"{r['dropped_at_rest']} at rest, {r['dropped_in_blocks']} in blocks",
        f"{r['rest_cpu_per_s'] * 1e3:.0f} ms/s" if "rest_cpu_per_s" in r else "n/a",
        r.get("rest_threads", "n/a"),
        rate,
        cpu,
        f"{r['completed']:,} of {r['blocks']:,}",
    ]


if __name__ == "__main__":
    main()

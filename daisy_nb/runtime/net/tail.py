"""Which jobs of a task with no ready block end and which stay, on the TCP hand-out, without I/O.

**Waiting for upstream blocks.** A ``Client`` that asks while its task has no ready block
waits (parked) for one, but only while a block could come for it: at most as many of the
task's jobs wait as it has **pending** blocks (waiting for upstream blocks, or for
neighbours in flight). Every block the task will ever hand out from now on is ready,
pending or a retry of one in flight, so a job beyond those can only idle; it is told to
end. Two chained tasks whose upstream task waits on one straggler: the downstream task
keeps one job for the one block that waits on the straggler, and its other jobs end,
where daisy holds them all until the straggler is done. When the pending blocks become
ready, the waiting jobs take them; a block no waiting job can take makes the pool start a
worker function (its spawn plan, as for a retry). **Once the upstream tasks are at their
tail** (what they have left is in flight: the pending blocks wait on blocks already
running, perhaps stragglers), **no job waits longer than a new job takes to start** (the
ski-rental rule below) for a pending block either: a job waiting for the block behind an
upstream straggler would otherwise be held for the straggler's whole length (in the
cluster benchmark, three downstream jobs idled 1-3 s each behind two stragglers), while
ending it and starting one when the block is ready costs at most what it had waited.
While an upstream task still hands out blocks, the wait is the pipeline's rhythm and the
job stays: ending it there started a job per block (a slow upstream task feeding a fast
one, 40 blocks: 38 job starts instead of 2). A task with no upstream task (its pending
blocks wait on its own blocks of the level before) counts as drained.

**The rent is paid once.** A job that waited in vain that long and ended has paid, for its
task, the rent of one pending block (or of the tail's retry): a job that asks later behind
the same tail (its own block done) is told to end at once instead of renting again, which
would double what the rule bounds. Handing out a block of the task (a retry, or a pending
block that became ready) starts the rentals again, for no more blocks than are pending.

A task is at its **tail** when no block of it is ready and none is pending (waiting for
upstream blocks): every block it has left is in flight. A ``Client`` that asks for a
block then is told to end (``NO_MORE``: its ``acquire_block()`` yields None, its program
and worker function return, a launcher's job ends), as daisy does, instead of holding a
job (a GPU, on a cluster) idle while the last, slowest blocks run.

**One job stays** per task (``KEEP_AT_TAIL``), parked, while a block in flight could still
need a retry (its failed attempts are fewer than the task's ``max_retries``), and it is
told to end as soon as none can (the last retryable block finished, or failed for good, or
the task was abandoned), **or once it has waited as long as a new job takes to start**
(the task's measured time from a worker function's start to its Client's first ask for a
block: submission, queue, start-up, and what the program sets up after its hello, a model
loaded say; a job's wait counts from that ask, not from its hello). That is the ski-rental
rule: a job kept idle for a retry that may never come costs at most what starting one for
it would have cost in waiting, so a long straggler's tail does not hold a second job for
its whole length (without it, two chained tasks with a 2 s straggler each held 8
job-seconds more than daisy, whose jobs all end). Until a job of the task has started
there is no measure, and the job stays while a retry can come. When a block fails at the
tail, the kept job takes its retry at once instead of a new job waiting in the batch
system's queue; a second failure at the same moment (or one after the kept job has gone)
is served by the pool's spawn plan, which starts one worker function per ready block that
no waiting job can take (:meth:`daisy_nb.runtime.local.functions.Functions.waiting` counts
the parked and the not yet connected jobs). Why one, not none and not one per retryable
block: none makes every tail failure wait for a job to be submitted, queued and started
(seconds on a local launcher, minutes on a busy cluster); one per block keeps most of the
jobs idle for the whole straggler time to cover failures that rarely come together. One
costs at most one idle job per task for the length of its tail, and is none with
``max_retries=0``.

:class:`TailKeep` decides; :class:`daisy_nb.runtime.net.handout.HandOut` asks it when a
connection asks at a task's tail and, for the one it keeps, again once the blocks in
flight changed (a release or an acquisition of the task: :meth:`TailKeep.touch`).
:func:`check_tail` is the invariant after the parked connections were served: at a
task's tail, at most ``KEEP_AT_TAIL`` of its connections are parked, and only while a
block in flight could still need a retry.

**Behind stragglers, no rent at all.** The rent is worth paying only while what a job waits
behind may end within it. Once every block in flight that the wait is behind (for a retry:
the task's own; for pending blocks: the upstream tasks', and the task's own when its blocks
depend on each other, ``read_write_conflict``) has run at least as long as a job of the task
takes to start and at least ``OUTLAST_MEDIANS`` (4) times its task's median block time,
those blocks are stragglers. A straggler's time is heavy-tailed (a slow node, a dense
region): one that has run ``t`` typically has as long again to run, longer than the rent. A
job waiting for a pending block behind them would wait out the whole rent in vain, and a job
kept for a retry would need one of them to fail within the rent, while they will most likely
still run when it runs out. So the job ends at once (:meth:`TailKeep.behind_stragglers`):
pending blocks behind stragglers only keep no job (one may still stay for a retry of the
task's own blocks in flight, as above); when a block it would have waited for is ready, the
pool starts a job for it, as it does after a rent ran out, so the block waits no longer than
it would have then. The rule needs every block in flight's time (the hand-out knows it for
the blocks its connections run; a block sent ahead starts when the one before it ends, so it
counts as long as that one), the job's start and the medians: without any of them, the rent
is paid as above. A retry that waits out a ``retry_backoff`` is pending on its own clock,
not behind a block: a task with one pays the rent. In the cluster benchmark
(``benchmarks/bench_tail.py``: two chained tasks, 1% of the blocks 25x longer), the jobs
kept behind stragglers waited about 3.4 job-seconds per run for nothing (every one of them
ended when its rent ran out): with the rule, the jobs' busy share of the job-seconds held
rose from 0.90-0.91 to 0.95.

**Downstream jobs at the upstream's pace.** While the upstream tasks still hand out blocks, a
downstream job that waits for them stays (the rhythm, above), but a task cannot use more jobs
than its upstream feeds: when an upstream job runs a straggler, its other jobs produce less
than the downstream jobs take, and those wait in turns, every one of them a little, for as
long as the straggler runs. So the task banks the seconds its jobs waited, parked, for a block
that came (:meth:`TailKeep.waited`), less ``PACE_LEAK`` (half a job) for every second that
passes: waits in the rhythm of a task that keeps up stay below that, while one job too many
makes a whole job's wait per second. When the bank holds a job's start, the next job of the
task that asks with nothing ready is told to end (if another job of the task stays for its
pending blocks), and the bank pays that much: a job ended in vain costs a job's start to
replace, no more than what its task's jobs had waited. From then on the task is **paced**: the
pool counts, for its spawn plan, the blocks its busy jobs will take within a job's start
(:meth:`daisy_nb.runtime.net.handout.HandOut.soon_free`) as taken, so that the job ended is not
started again for the first block no job is idle for, but once the ready blocks outgrow what
the busy jobs can take (the upstream's straggler is done). Neither holds once the upstream
tasks are drained: the tail's rules above take over. In the cluster benchmark with 4 jobs per
task (``bench_tail.py --jobs 4``), one job of ``a`` held by a 5 s straggler left ``b``'s four
jobs waiting about 5 job-seconds in all (daisy 2.0.0's, started one by one, 3.5): the jobs'
busy share of the job-seconds held was 0.917 against daisy's 0.940, and is 0.956 with the
rule (one job more started in all, the makespan unchanged; with 8 jobs per task, unchanged).

A ``Task(speculative=...)`` keeps more at its tail: up to one parked job per block in flight,
for backup copies of stragglers (:mod:`daisy_nb.runtime.net.backups`), until the task is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "KEEP_AT_TAIL",
    "OUTLAST_MEDIANS",
    "PACE_LEAK",
    "TailKeep",
    "at_tail",
    "check_tail",
    "held_rows",
    "pending_count",
    "running_secs",
]

KEEP_AT_TAIL = 1  # jobs of a task kept parked at its tail while a retry could need one
OUTLAST_MEDIANS = 4.0  # a block in flight that ran this many median block times (and a job's start): a straggler
PACE_LEAK = 0.5  # jobs: a task's jobs waiting for upstream blocks less than this on average keep its rhythm


def _unknown(tid: str) -> None:
    return None


def running_secs(conns: Iterable[Any], s, tid: str, now_ns: int) -> list[float] | None:
    """How long each block of ``tid`` in flight has run (s), from the hand-out's connections
    (``conns``: :class:`daisy_nb.runtime.net.handout.Conn`), or None unless they hold every one
    of them, once (no block of a local worker, no backup copy). A connection runs the first block
    it holds, since it was sent or the one before it ended; a block sent ahead starts when that
    one ends, so it cannot end sooner: it counts as long as that one."""
    out: list[float] = []
    for cc in conns:
        if cc.held and cc.tr is not None and cc.tr.tid == tid:
            started = max(next(iter(cc.held.values())), cc.t_free_ns)
            out.extend([(now_ns - started) / 1e9] * len(cc.held))
    return out if len(out) == s.processing_count(tid) else None


def at_tail(s, tid: str) -> bool:
    """No block of ``tid`` is ready or pending: what it has left is in flight (or it was abandoned)."""
    return s.is_abandoned(tid) or (s.ready_count(tid) == 0 and s.remaining_count(tid) - s.processing_count(tid) <= 0)


def pending_count(s, tid: str) -> int:
    """Blocks of ``tid`` neither ready, in flight nor finished: waiting for upstream blocks or
    neighbours, or failed ones waiting for their retry (``Task(retry_backoff=...)``)."""
    return max(0, s.remaining_count(tid) - s.processing_count(tid) - s.ready_count(tid))


def held_rows(conns: Iterable[Any], tid: str) -> list[int]:
    """The rows of ``tid`` the hand-out's connections hold (its blocks in flight there)."""
    return [i for cc in conns if cc.tr is not None and cc.tr.tid == tid for i in cc.held]


def retry_possible(s, tid: str, held: Iterable[int]) -> bool:
    """One of the blocks ``held`` (rows of ``tid`` in flight) would be retried if it failed now."""
    max_r = s.tasks[tid].max_retries
    if max_r <= 0 or s.is_abandoned(tid):
        return False
    retries = s.block_states(tid).retries  # failed attempts so far, per row
    return any(int(retries[i]) < max_r for i in held)


class TailKeep:
    """Whether a job that asks at its task's tail stays parked (see the module docstring)."""

    def __init__(
        self,
        scheduler,
        start_secs: Callable[[str], float | None] = _unknown,
        median_secs: Callable[[str], float | None] = _unknown,
        conns: Callable[[], Iterable[Any]] = tuple,
        keep: int = KEEP_AT_TAIL,
    ):
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.s = scheduler
        self.keep = keep
        self.start_secs = start_secs  # task id -> how long a new job takes to start (None: not known)
        self.median_secs = median_secs  # task id -> its median block time (None: no block finished yet)
        self.conns = conns  # the hand-out's connections (what blocks in flight have run: running_secs)
        self._changed: set[str] = set()  # tasks whose blocks in flight changed since their kept job was judged
        # rentals that ran out since the task last handed out a block (the rent was paid: not again)
        self._bought_pending: dict[str, int] = {}  # jobs that waited behind a drained upstream, then ended
        self._bought_retry: set[str] = set()  # the job kept for a retry waited, then ended
        # task id -> (job-seconds its jobs waited for upstream blocks, less the leak; when, ns): "the pace"
        self._bank: dict[str, tuple[float, int]] = {}
        self.paced: set[str] = set()  # tasks that ended a job for the upstream's pace (spawns count busy jobs)

    def touch(self, tid: str) -> None:
        """Blocks of ``tid`` were released or acquired: a kept job of it is judged again."""
        self._changed.add(tid)

    def handed_out(self, tid: str) -> None:
        """``tid`` handed out blocks: a retry, or pending blocks that became ready. What its jobs have
        waited in vain so far was for other blocks: the rentals start again, but never for more
        pending blocks than are left."""
        self._bought_retry.discard(tid)
        if tid in self._bought_pending:
            left = min(self._bought_pending[tid], pending_count(self.s, tid))
            if left > 0:
                self._bought_pending[tid] = left
            else:
                del self._bought_pending[tid]

    def retry_rent_paid(self, tid: str) -> bool:
        """A job of ``tid`` kept for a retry waited as long as a job takes to start and ended, and the
        task has handed out no block since: no job is kept for a retry again before it does."""
        return tid in self._bought_retry

    def bought(self, tid: str) -> int:
        """Pending blocks of ``tid`` behind a drained upstream no job waits for any more: one waited
        for each as long as a job takes to start, and ended."""
        return min(self._bought_pending.get(tid, 0), pending_count(self.s, tid))

    def waited_enough(self, tid: str, waited_secs: float) -> bool:
        """A job of ``tid`` kept for a retry has waited as long as a new one takes to start."""
        limit = self.start_secs(tid)
        return limit is not None and waited_secs >= limit

    def behind_stragglers(self, tid: str, for_retry: bool, now_ns: int | None) -> bool:
        """A job of ``tid`` would wait (``for_retry``: for a retry at the tail; else for pending
        blocks) only behind stragglers: every block in flight it waits behind has run, at
        ``now_ns``, at least as long as a job of ``tid`` takes to start and ``OUTLAST_MEDIANS``
        times its task's median (see "Behind stragglers" in the module docstring)."""
        limit = self.start_secs(tid)
        if limit is None or now_ns is None:
            return False
        if for_retry:
            behind = [tid]
        elif self.s.retry_waiting_count(tid) > 0:
            return False  # a retry waiting out its backoff is pending on its own clock
        else:
            behind = self.s.upstream_task_ids(tid)
            if getattr(self.s.tasks[tid], "read_write_conflict", True):
                behind.append(tid)  # pending blocks may wait on the task's own blocks in flight
        seen = False
        for u in behind:
            if not self.s.processing_count(u):
                continue
            med = self.median_secs(u)
            if med is None:
                return False
            secs = running_secs(self.conns(), self.s, u, now_ns)
            if secs is None:
                return False
            need = max(limit, OUTLAST_MEDIANS * med)
            if any(t < need for t in secs):
                return False
            seen = True
        return seen

    def waited(self, tid: str, secs: float, now_ns: int) -> None:
        """A job of ``tid`` parked for ``secs`` got a block at ``now_ns``: while the upstream tasks
        still hand out blocks, its wait goes into the task's bank ("the upstream's pace")."""
        if secs > 0 and self.s.upstream_task_ids(tid) and not self.upstream_drained(tid):
            self._bank[tid] = (self.bank(tid, now_ns) + secs, now_ns)

    def bank(self, tid: str, now_ns: int) -> float:
        """The job-seconds ``tid``'s jobs waited for upstream blocks, less ``PACE_LEAK`` per second since."""
        b, t = self._bank.get(tid, (0.0, now_ns))
        return max(0.0, b - PACE_LEAK * max(0, now_ns - t) / 1e9)

    def too_many(self, tid: str, others: Callable[[], int], now_ns: int | None) -> bool:
        """A job of ``tid`` asks with nothing ready while the upstream hands out blocks: end it (and pay
        the bank a job's start) because the task's jobs waited a job's start beyond the pace? Only
        with ``others()`` (the task's other jobs, not told to end) to wait for its pending blocks."""
        limit = self.start_secs(tid)
        if limit is None or now_ns is None:
            return False
        bank = self.bank(tid, now_ns)
        if bank < limit or others() < 1:
            return False
        self._bank[tid] = (bank - limit, now_ns)
        self.paced.add(tid)
        return True

    def upstream_drained(self, tid: str) -> bool:
        """Every task ``tid`` waits on is at its tail (or done, or abandoned): its pending blocks wait
        on blocks already in flight (perhaps stragglers), not on blocks still to be handed out."""
        return all(at_tail(self.s, u) for u in self.s.upstream_task_ids(tid))

    def stays(
        self,
        tid: str,
        kept_others: int,
        waited_secs: float = 0.0,
        now_ns: int | None = None,
        others: Callable[[], int] = lambda: 0,
    ) -> bool:
        """A job of ``tid`` asks while no block of it is ready: True if it stays parked, for a pending
        block or (at the tail) a retry. ``kept_others``: the task's other parked jobs; ``waited_secs``:
        how long this job has been without a block; ``now_ns``: when (None: no straggler rule);
        ``others()``: the task's other jobs not told to end (the upstream's pace)."""
        if self.s.is_abandoned(tid):
            return False
        pending = self._waited_for(tid, now_ns)
        long = self.waited_enough(tid, waited_secs)  # ski rental: idle as long as a new job takes to start
        if kept_others < pending:
            if not self.upstream_drained(tid):
                self._bought_pending.pop(tid, None)  # the upstream hands out blocks again: its rhythm
                return not self.too_many(tid, others, now_ns)  # ... but not more jobs than it feeds
            if kept_others >= pending - self.bought(tid):  # this block's rent was paid once: not again
                return False
            if long:
                self._bought_pending[tid] = self.bought(tid) + 1
                return False
            return True
        if kept_others >= pending + self.keep or tid in self._bought_retry:
            return False
        if long:
            self._bought_retry.add(tid)
            return False
        self._changed.discard(tid)
        held = held_rows(self.conns(), tid)
        return retry_possible(self.s, tid, held) and not self.behind_stragglers(tid, True, now_ns)

    def rejudge(
        self, tid: str, n_parked: int, waited: Callable[[], float] = lambda: 0.0, now_ns: int | None = None
    ) -> bool:
        """No block of ``tid`` is ready and ``n_parked`` of its jobs are parked, the longest waiting
        for ``waited()`` seconds (asked only when it matters): judge them again? Yes when more are
        parked than pending blocks and a kept one can use, when the upstream tasks are drained and
        a waiting job has paid its rent or waits only behind stragglers, or when the one kept for a
        retry may no longer be needed (blocks in flight changed since it was judged, none is left
        in flight, it has waited long enough, or they are all stragglers)."""
        if self.s.is_abandoned(tid):
            return True
        pending = self._waited_for(tid, now_ns)
        if n_parked <= pending:
            return self.upstream_drained(tid) and (
                n_parked > pending - self.bought(tid) or self.waited_enough(tid, waited())
            )
        return (
            n_parked > pending + self.keep
            or tid in self._bought_retry
            or tid in self._changed
            or self.s.processing_count(tid) == 0
            or self.waited_enough(tid, waited())
            or self.behind_stragglers(tid, True, now_ns)
        )

    def _waited_for(self, tid: str, now_ns: int | None) -> int:
        """The pending blocks of ``tid`` a job may wait for: none once the upstream tasks are
        drained and those blocks wait behind stragglers only (then a job stays only for a retry)."""
        pending = pending_count(self.s, tid)
        if pending and self.upstream_drained(tid) and self.behind_stragglers(tid, False, now_ns):
            return 0
        return pending


def check_tail(core: Any, trs: Mapping[str, Any], now_ns: int | None = None) -> None:
    """Raise ``AssertionError`` unless, for every task with no ready block, at most its pending blocks
    plus ``keep`` connections are parked, more than its pending blocks only while a block in
    flight could still need a retry, and (given ``now_ns``, the time of the ``serve_parked`` just
    done) the longest waiting has waited less than a job takes to start, when one is kept for a
    retry or the task's upstream tasks are drained (:meth:`TailKeep.upstream_drained`). Given
    ``now_ns``, pending blocks behind stragglers only (:meth:`TailKeep.behind_stragglers`) count
    as none, and a connection is kept for a retry only while the task's own blocks in flight are
    not all stragglers."""
    s = core.s
    for tid, tr in trs.items():
        ccs = core.parked.get(tr, {})
        if not ccs or s.is_abandoned(tid) or s.ready_count(tid) > 0:
            continue
        if core.bk.keep_at_tail(tid, len(ccs) - 1):  # kept for backup copies (net/backups.py)
            continue
        pending = pending_count(s, tid)
        behind = bool(pending and core.tail.upstream_drained(tid) and core.tail.behind_stragglers(tid, False, now_ns))
        if behind:
            pending = 0  # no job waits for pending blocks behind stragglers only
        assert len(ccs) <= pending + core.tail.keep, (
            f"task {tid!r}: {len(ccs)} connections parked for {pending} pending block(s)"
            + (" (the others wait behind stragglers only)" if behind else "")
        )
        bought = core.tail.bought(tid) if core.tail.upstream_drained(tid) and not behind else 0
        assert not bought or len(ccs) <= pending - bought, (
            f"task {tid!r}: {len(ccs)} connections parked for {pending} pending block(s), {bought} of which"
            " a job already waited for in vain"
        )
        assert len(ccs) <= pending or not core.tail.retry_rent_paid(tid), (
            f"task {tid!r}: a connection kept for a retry after the one kept before had waited in vain"
        )
        if len(ccs) > pending:
            assert retry_possible(s, tid, held_rows(core.conns.values(), tid)), (
                f"task {tid!r}: a connection kept for a retry, but no retry can come"
            )
        if now_ns is not None and (len(ccs) > pending or core.tail.upstream_drained(tid)):
            waited = (now_ns - min(cc.t_free_ns for cc in ccs)) / 1e9
            assert not core.tail.waited_enough(tid, waited), (
                f"task {tid!r}: a connection parked after waiting {waited:.3f} s, as long as a job takes to start"
            )
            assert len(ccs) <= pending or not core.tail.behind_stragglers(tid, True, now_ns), (
                f"task {tid!r}: a connection kept for a retry behind stragglers only"
            )

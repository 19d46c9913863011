"""``Speculation``: a slow, obviously-correct twin of ``daisy_nb.scheduling.speculation.Speculation``.

Written from the rule in that module's docstring. It keeps nothing but the list of events it
was given; every answer replays the whole list from the start: which copies live, which were
told to stop, which rows succeeded and in how many seconds, how many copies each row's current
attempt has started. The median is written out on a sorted list.
"""

from __future__ import annotations

WINDOW = 64
MIN_SAMPLES = 5
SETTLE = 2  # successes per running block that settle the median
GIVE_UP = 2  # a backup past 2 x k x the median (and past the far end) is stopped
Z90 = 1.2815515655446004  # the standard normal's 90th percentile
Z99 = 2.3263478740408408  # its 99th: in the bulk, no backup of a block that has not run past the 99th percentile
TAIL = 1.5  # at a task's tail, the factor is at most this


def median(xs):
    """The middle of the sorted values (the mean of the two middle ones for an even count)."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class Speculation:
    """Same events and answers as the fast one, as plain tuples, replayed from a log."""

    def __init__(self, factors, totals):
        self.factors = list(factors)
        self.totals = list(totals)
        self.log = []  # ("start", t, row, copy, now) | ("end", copy, now, ok) | ("stop", copy); lost: an end, ok False
        self._memo = (-1, None)  # (log length, its replay): the log only grows, so this is its replay

    def replay(self):
        """The state after every logged event, and the outcome of the last one (do not mutate it)."""
        if self._memo[0] == len(self.log):
            return self._memo[1]
        live = {}  # copy -> (t, row, start, order)
        stopping = {}  # copy -> (t, row, start, order)
        done = [[] for _ in self.factors]  # per task: (row, seconds) in the order they succeeded
        attempt = {}  # (t, row) -> copies started in its current attempt
        last = None
        for order, ev in enumerate(self.log):
            if ev[0] == "start":
                _, t, row, copy, now = ev
                live[copy] = (t, row, now, order)
                attempt[(t, row)] = attempt.get((t, row), 0) + 1
                last = None
                continue
            if ev[0] == "stop":  # a slow backup told to stop: no longer live, its row runs on
                stopping[ev[1]] = live.pop(ev[1])
                continue
            _, copy, now, ok = ev
            if copy in stopping:
                del stopping[copy]
                last = (False, None, True)
                continue
            t, row, start, _ = live.pop(copy)
            twins = [c for c, v in live.items() if (v[0], v[1]) == (t, row)]
            if not ok and twins:
                last = (False, None, False)  # the twin decides
                continue
            del attempt[(t, row)]
            if not ok:
                last = (True, None, False)
                continue
            done[t].append((row, now - start))
            interrupt = None
            for c in twins:
                stopping[c] = live.pop(c)
                interrupt = (t, row, c)
            last = (True, interrupt, False)
        state = {"live": live, "stopping": stopping, "done": done, "attempt": attempt, "last": last}
        self._memo = (len(self.log), state)
        return state

    # -- what the state machine needs to choose its events ------------------------------------
    def on(self, t):
        return self.factors[t] is not None

    def live(self):
        return dict(self.replay()["live"])

    def stopping(self):
        st = self.replay()["stopping"]
        return sorted(st, key=lambda c: st[c][3])

    def done_rows(self, t):
        return [row for row, _ in self.replay()["done"][t]]

    def running(self, t):
        out = {}
        for c, (tt, row, _, _) in sorted(self.live().items(), key=lambda kv: kv[1][3]):
            if tt == t:
                out.setdefault(row, []).append(c)
        return out

    def may_start(self, t, row, copy):
        """Whether ``started(t, row, copy)`` is allowed (else the fast one raises ValueError)."""
        s = self.replay()
        if not self.on(t) or copy in s["live"] or copy in s["stopping"]:
            return False
        if row in [r for r, _ in s["done"][t]]:
            return False
        return s["attempt"].get((t, row), 0) < 2

    def median(self, t):
        """Of the last WINDOW successes; before WINDOW of them, each running row is one more
        time, longer than any (infinite); an infinite middle means no median."""
        done = [x for _, x in self.replay()["done"][t]]
        secs = done[-WINDOW:]
        if len(secs) < MIN_SAMPLES:
            return None
        if len(done) < WINDOW:
            secs = secs + [float("inf")] * len(self.running(t))
        m = median(secs)
        return None if m == float("inf") else m

    def far_end(self, t, z=3.0):
        """The last WINDOW successes' median m times (q / m) ** (z / Z90), q the smallest of them
        with at least 90% of them at or below it, but never the largest; None before
        MIN_SAMPLES successes."""
        secs = sorted(x for _, x in self.replay()["done"][t][-WINDOW:])
        if len(secs) < MIN_SAMPLES:
            return None
        q = next(x for i, x in enumerate(secs) if (i + 1) >= 0.9 * len(secs) or i + 2 == len(secs))
        m = median(secs)
        return m * (q / m) ** (z / Z90) if m > 0 else q

    def settled(self, t):
        n = len(self.replay()["done"][t])
        return n >= WINDOW or 2 * n >= self.totals[t] or n >= max(MIN_SAMPLES, SETTLE * len(self.running(t)))

    # -- events --------------------------------------------------------------------------------
    def started(self, t, row, copy, now):
        assert self.may_start(t, row, copy)
        self.log.append(("start", t, row, copy, now))

    def finished(self, t, row, copy, now, ok):
        self.log.append(("end", copy, now, ok))
        return self.replay()["last"]

    def lost(self, copy):
        self.log.append(("end", copy, None, False))
        return self.replay()["last"]

    # -- the query -----------------------------------------------------------------------------
    def can_back(self, t):
        """Running rows of ``t`` in their first copy's attempt with that copy alone: a backup may come."""
        s = self.replay()
        rows = [row for tt, row, _, _ in s["live"].values() if tt == t and s["attempt"][(t, row)] == 1]
        return sum(1 for row in set(rows) if rows.count(row) == 1)

    def candidates(self, t, now, idle_workers, busy_neighbours, at_tail=False):
        if not self.on(t) or idle_workers <= 0:
            return []
        s = self.replay()
        if not self.settled(t):
            return []
        med = self.median(t)
        if med is None:
            return []
        late = []
        for c, (tt, row, start, order) in s["live"].items():
            if tt != t or s["attempt"][(t, row)] != 1:
                continue
            k = min(self.factors[t], TAIL) if at_tail else self.factors[t]
            limit = k * med if at_tail else max(k * med, self.far_end(t, Z99) or 0.0)
            if now - start > limit and not busy_neighbours(row):
                late.append((start, order, row, c))
        return [(t, row, c) for _, _, row, c in sorted(late)][:idle_workers]

    def slow_backups(self, t, now):
        """Backups (the later of a row's two live copies) that ran past 2 x k x the median and past
        the far end: told to stop."""
        if not self.on(t) or self.median(t) is None:
            return []
        s = self.replay()
        out = []
        for row, copies in self.running(t).items():
            if len(copies) == 2:
                start, order = s["live"][copies[1]][2:]
                if now - start > max(GIVE_UP * self.factors[t] * self.median(t), self.far_end(t) or 0.0):
                    out.append((start, order, row, copies[1]))
        out.sort()
        for _, _, _, c in out:
            self.log.append(("stop", c))
        return [(t, row, c) for _, _, row, c in out]

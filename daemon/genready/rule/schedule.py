"""When to probe next while a start is not yet verified: by what the last failure cost the server.

A refused connection costs the server nothing, and a 5xx or the server's own "not ready"
(`unhealthy`) answered at once ("Loading model") almost nothing; a server that can generate
should be noticed within a fraction of a second, so both are retried every FAST_RETRY seconds.
Everything that made the server work or wait (a timeout, a slow answer, a 200 that was no
generation, an answer from a foreign process, a 429 "too many requests") backs off:
`backoff_initial` doubling to `backoff_max`. A 4xx other than 408/429 means the server is up
and refuses the probe's request: no retry soon will change
that, so it is retried at `backoff_max`. A success during warmup is a real generation: the next
one follows after `backoff_initial`.

Fast retries are for a server someone is waiting for. Once a start has waited longer than
`load_timeout` (the target is `stuck`), refusals and fast 5xx back off like everything else:
a server that never finishes costs a probe per `backoff_max`, not five a second forever.

Pure logic, no clock and no I/O: the gate sleeps (or waits for the listen watcher, listen.py)
for the delay this returns. Any failure class this module does not know is treated as costly.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from typing import Final, NamedTuple

from genready.vocab import Failure, ProbeResult

FAST_RETRY: Final = 0.2  # seconds between cheap retries: refused connections, fast 5xx
# A failed probe that took longer than this made the server work (or it is overloaded): it is
# not retried fast. "Loading model" 503s come back in about a millisecond.
SLOW_ANSWER: Final = 0.5
JITTER: Final = 0.2  # ±20 %: many genreadys (or targets) must not probe in lockstep


class Cost(enum.Enum):
    """What a probe's outcome says about retrying it."""

    NOTHING = "nothing"  # nothing answered: the port is closed (watchable: listen.py)
    CHEAP = "cheap"  # answered at once with a server error: still loading
    COSTLY = "costly"  # the server worked or waited: back off
    REJECTED = "rejected"  # the server refuses this request (4xx): retry at backoff_max
    SUCCESS = "success"  # a verified generation (warmup continues)


def cost(result: ProbeResult) -> Cost:
    """Classify one probe's outcome for the schedule."""
    if result.ok:
        return Cost.SUCCESS
    if result.failure is Failure.REFUSED:
        return Cost.NOTHING
    if result.failure is Failure.REJECTED:
        return Cost.REJECTED
    if result.failure is Failure.UNHEALTHY:
        # The server's own "not ready" (a health 503, a router still loading the model), said at
        # once, is as cheap as a quick 5xx; said after a wait, the server worked for it.
        return Cost.CHEAP if result.seconds < SLOW_ANSWER else Cost.COSTLY
    if result.failure is Failure.HTTP_STATUS and result.status is not None:
        if result.status in (408, 429):
            return Cost.COSTLY  # "too slow" / "too many": the server asks us to slow down
        if 400 <= result.status < 500:
            return Cost.REJECTED
        if result.status >= 500 and result.seconds < SLOW_ANSWER:
            return Cost.CHEAP
    return Cost.COSTLY


class Wait(NamedTuple):
    """What to do before the next probe."""

    seconds: float
    watch: bool  # nothing answered: the gate may wait for the port to listen instead (listen.py)


class Schedule:
    """The retry delays of one target's probing of one instance.

    `after(result)` returns how long to wait before the next probe. The exponential backoff
    level advances only on costly failures and is reset by a success; cheap failures in
    between neither advance nor reset it, so a server that alternates between a fast 503 and a
    timeout still backs off for the timeouts.
    """

    def __init__(self, backoff_initial: float, backoff_max: float, *, patience: float = float("inf"),
                 fast: float = FAST_RETRY, jitter: Callable[[], float] | None = None) -> None:
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # A fast retry is never slower than the costly case's cap: backoff_max bounds how late a
        # server that can generate is noticed.
        self.fast = min(fast, backoff_max)
        self.patience = patience  # load_timeout: how long fast retries are worth their cost
        self._jitter = jitter or (lambda: random.uniform(1 - JITTER, 1 + JITTER))
        self._backoff = backoff_initial

    def after(self, result: ProbeResult, waited: float = 0.0) -> Wait:
        """What to do after `result`, `waited` seconds after the start began to be probed."""
        c = cost(result)
        if waited >= self.patience and c in (Cost.NOTHING, Cost.CHEAP):
            c = Cost.COSTLY  # stuck: nobody is waiting on a tight lag any more
        return Wait(self.delay(c), c is Cost.NOTHING)

    def delay(self, c: Cost) -> float:
        if c is Cost.SUCCESS:
            self._backoff = self.backoff_initial
            return self._bounded(self.backoff_initial)
        if c in (Cost.NOTHING, Cost.CHEAP):
            return self._bounded(self.fast)
        if c is Cost.REJECTED:
            return self.backoff_max
        d = self._bounded(self._backoff)
        self._backoff = min(self._backoff * 2, self.backoff_max)
        return d

    def _bounded(self, base: float) -> float:
        return min(self.backoff_max, base * self._jitter())

"""schedule.py in-process: which outcomes are retried fast, which back off, and the caps.

No clocks and no sleeping: the schedule is pure, and jitter is pinned (or bounded) here.
"""

from __future__ import annotations

import pytest

from genready.rule.schedule import FAST_RETRY, SLOW_ANSWER, Cost, Schedule, cost
from genready.vocab import Failure, ProbeResult


def failed(failure: Failure, status: int | None = None, seconds: float = 0.002) -> ProbeResult:
    return ProbeResult(False, failure, "detail", None, seconds, 0, status)


OK = ProbeResult(True, None, "1 token(s)", 4242, 0.01, 1, 200)
REFUSED = failed(Failure.REFUSED)
LOADING_503 = failed(Failure.HTTP_STATUS, 503)  # llama.cpp's {"message":"Loading model"}, at once
TIMEOUT = failed(Failure.TIMEOUT, seconds=30.0)


def schedule(initial: float = 0.25, maximum: float = 2.0, patience: float = float("inf")) -> Schedule:
    return Schedule(initial, maximum, patience=patience, jitter=lambda: 1.0)


def secs(s: Schedule, result: ProbeResult, waited: float = 0.0) -> float:
    return s.after(result, waited).seconds


@pytest.mark.parametrize(("result", "expected"), [
    (OK, Cost.SUCCESS),
    (REFUSED, Cost.NOTHING),
    (LOADING_503, Cost.CHEAP),
    (failed(Failure.HTTP_STATUS, 500), Cost.CHEAP),
    (failed(Failure.HTTP_STATUS, 502), Cost.CHEAP),
    (failed(Failure.HTTP_STATUS, 503, seconds=SLOW_ANSWER + 0.1), Cost.COSTLY),  # slow: the server worked
    (failed(Failure.HTTP_STATUS, 429), Cost.COSTLY),  # "too many requests": slow down
    (failed(Failure.HTTP_STATUS, 408), Cost.COSTLY),
    (failed(Failure.HTTP_STATUS, 401), Cost.REJECTED),
    (failed(Failure.HTTP_STATUS, 404), Cost.REJECTED),
    (failed(Failure.REJECTED, 401), Cost.REJECTED),  # what the probe reports for a 4xx refusal
    (failed(Failure.REJECTED), Cost.REJECTED),  # several models listed: no status of its own
    (failed(Failure.TLS), Cost.COSTLY),  # a handshake is work, and a bad certificate stays bad
    (failed(Failure.HTTP_STATUS, None), Cost.COSTLY),  # no status known: assume the worst
    (TIMEOUT, Cost.COSTLY),
    (failed(Failure.BAD_RESPONSE, 200), Cost.COSTLY),  # it generated (something)
    (failed(Failure.FOREIGN_OWNER, 503), Cost.COSTLY),  # someone else's server: don't hammer it
    (failed(Failure.STALE_INSTANCE), Cost.COSTLY),
])
def test_cost_of_each_outcome(result: ProbeResult, expected: Cost) -> None:
    assert cost(result) is expected


def test_refused_and_fast_503_retry_fast_without_growing() -> None:
    s = schedule()
    assert [secs(s, REFUSED) for _ in range(20)] == [FAST_RETRY] * 20
    assert [secs(s, LOADING_503) for _ in range(20)] == [FAST_RETRY] * 20


def test_timeouts_back_off_from_initial_doubling_to_max() -> None:
    s = schedule(0.25, 2.0)
    assert [secs(s, TIMEOUT) for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_cheap_failures_between_costly_ones_neither_reset_nor_advance_the_backoff() -> None:
    s = schedule(0.25, 2.0)
    assert secs(s, TIMEOUT) == 0.25
    assert secs(s, TIMEOUT) == 0.5
    assert secs(s, LOADING_503) == FAST_RETRY
    assert secs(s, REFUSED) == FAST_RETRY
    assert secs(s, TIMEOUT) == 1.0


def test_success_resets_the_backoff_and_paces_warmup_at_backoff_initial() -> None:
    s = schedule(0.25, 2.0)
    for _ in range(5):
        secs(s, TIMEOUT)
    assert secs(s, OK) == 0.25
    assert secs(s, TIMEOUT) == 0.25


def test_rejected_retries_at_backoff_max() -> None:
    s = schedule(0.25, 2.0)
    assert secs(s, failed(Failure.HTTP_STATUS, 401)) == 2.0
    assert secs(s, TIMEOUT) == 0.25  # and does not advance the costly backoff


def test_a_slow_server_gets_at_most_a_few_requests_per_second() -> None:
    # Whatever it answers, a server that takes SLOW_ANSWER or more per answer is not retried fast.
    s = schedule(0.25, 2.0)
    slow = failed(Failure.HTTP_STATUS, 503, seconds=SLOW_ANSWER)
    delays = [secs(s, slow) for _ in range(10)]
    rate = len(delays) / sum(d + SLOW_ANSWER for d in delays)
    assert delays[0] == 0.25 and delays[-1] == 2.0
    assert rate < 5


def test_backoff_max_bounds_every_delay_even_the_fast_one() -> None:
    s = Schedule(0.01, 0.05, jitter=lambda: 1.2)
    for r in (REFUSED, LOADING_503, TIMEOUT, OK, failed(Failure.HTTP_STATUS, 400)):
        assert secs(s, r) <= 0.05


def test_jitter_stays_within_bounds() -> None:
    s = Schedule(0.25, 2.0)  # real random jitter
    fast = [secs(s, LOADING_503) for _ in range(200)]
    assert min(fast) >= FAST_RETRY * 0.8 and max(fast) <= FAST_RETRY * 1.2
    assert len(set(fast)) > 1  # it does vary: genreadys must not probe in lockstep


@pytest.mark.parametrize("failure", list(Failure))
def test_every_failure_class_has_a_deliberate_cost(failure: Failure) -> None:
    # Only "nothing answered" is free to retry; any class added later backs off until someone
    # decides otherwise here and in schedule.cost.
    expected = Cost.NOTHING if failure is Failure.REFUSED else Cost.COSTLY
    if failure is Failure.REJECTED:  # a refusal that needs an admin
        expected = Cost.REJECTED
    if failure is Failure.UNHEALTHY:  # the server's own "not ready", said at once: like a quick 5xx
        expected = Cost.CHEAP
    assert cost(failed(failure)) is expected


def test_unhealthy_said_at_once_is_cheap_said_slowly_costly() -> None:
    assert cost(failed(Failure.UNHEALTHY, 503)) is Cost.CHEAP  # SGLang's /health while Starting
    assert cost(failed(Failure.UNHEALTHY, 503, seconds=SLOW_ANSWER + 0.1)) is Cost.COSTLY
    assert secs(schedule(), failed(Failure.UNHEALTHY, 503)) <= FAST_RETRY * 1.2


def test_only_a_refusal_asks_to_watch_the_port() -> None:
    s = schedule()
    assert s.after(REFUSED).watch
    assert not any(s.after(r).watch for r in (LOADING_503, TIMEOUT, OK, failed(Failure.HTTP_STATUS, 404)))


def test_a_stuck_start_backs_off_even_for_cheap_failures() -> None:
    # Past load_timeout nobody waits on a tight lag: a server that never finishes loading gets a
    # probe per backoff_max at most, not five a second forever, and no port watch.
    s = schedule(0.25, 2.0, patience=1800.0)
    assert secs(s, LOADING_503, waited=1799.0) == FAST_RETRY
    assert [secs(s, LOADING_503, waited=1800.0) for _ in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]
    stuck_refusal = s.after(REFUSED, waited=3600.0)
    assert stuck_refusal == (2.0, False)

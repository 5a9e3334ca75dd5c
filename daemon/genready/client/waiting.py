"""Waiting for a verified start, the one way `wait`, `restart`, `sweep` and `sweep restore` do it.

`restart_and_wait` is "restart, then wait for a verified start newer than the restart": the time
is taken before systemd is asked, and /ready?since= counts only a start whose process began
after it. On CLOCK_MONOTONIC (since_monotonic=), the clock of systemd's *TimestampMonotonic and
the same for every process of the host (systemd, genready and this client are on one host: the
client restarts the unit through that very manager): a wall clock stepped back during the
restart would make the new start look older than a wall-clock since= and the wait never end.
While waiting the client asks the daemon only: the daemon's 503 carries
`start_failed` when such a start ended before it was verified, with how it ended, its last lines
and whether systemd may start the unit again by itself (`restarting`). So a start that fails is
known within a long-poll, and systemd is asked nothing by the client meanwhile.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from genready.client import client

DAEMON_RETRY: Final = 1.0  # seconds between attempts while the daemon does not answer
SETTLE: Final = 0.5  # seconds: more than the daemon waits before it says a down unit is not restarting
LONG_POLL: Final = 3000.0  # seconds of one long-poll when nothing is shown meanwhile (the API caps it at 3600)
# Seconds between questions while the daemon refuses long-polls (its slots are all held, which any
# local user can do): the first pause, doubled after each refusal up to the last.
REFUSED_PAUSE: Final = (0.25, 2.0)


class OnFailure(enum.Enum):
    """What a failed start newer than since= does to the wait."""

    WAIT = "wait"  # keep waiting: a new start may come (plain `wait`)
    FINAL = "final"  # stop once systemd will not start the unit again by itself (`restart`, `wait --since`)
    ANY = "any"  # stop at the first, even while systemd restarts the unit (a sweep point: a crash loop is no load)


@dataclass(frozen=True)
class Outcome:
    """How a wait ended. `code`: 200 ready, 503 not ready, 0 the daemon never answered, or the
    daemon's 400/404. `failed`: the start_failed that ended it, else None."""

    code: int
    body: Any
    since: float | None
    failed: Mapping[str, Any] | None = None
    unreachable: str = ""  # the last connection error, when code is 0

    @property
    def ready(self) -> bool:
        return self.code == 200


def start_failed(body: Any) -> Mapping[str, Any] | None:
    """A 503 body's start_failed (of the one target, or the first target that has one)."""
    if not isinstance(body, dict):
        return None
    for t in body.get("targets", [body]):
        if isinstance(t, dict) and isinstance(t.get("start_failed"), dict):
            return t["start_failed"]  # type: ignore[no-any-return]
    return None


def refused(code: int, body: Any) -> bool:
    """Is this the daemon's "too many long-polls in flight" 503 (a refusal, not an answer)?"""
    return code == 503 and isinstance(body, dict) and str(body.get("error", "")).startswith("too many long-polls")


def _ready_path(target: str | None, **query: object) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items() if v is not None)
    return (f"/ready/{target}" if target else "/ready") + (f"?{q}" if q else "")


def wait_ready(base: str, target: str | None, timeout: float, since: float | None, *,
               on_failure: OnFailure = OnFailure.WAIT, poll: float | None = None,
               tick: Callable[[int, Any], None] | None = None, since_mono: float | None = None) -> Outcome:
    """Long-poll /ready until ready, until a failed start ends it (`on_failure`), or `timeout`.

    `tick(code, body)` runs after each answer that does not end the wait (code 0 with
    {"reason": ...} while the daemon does not answer): live lines, a sweep's signals (it may
    raise). With `tick`, each long-poll lasts at most `poll` seconds. A daemon that does not
    answer is waited for until `timeout` too: readiness is what the caller waits for, and the
    daemon is on its way. While the daemon refuses long-polls (all its slots held), each refusal
    is followed by a question without wait= (always answered) and a growing pause. `since_mono`
    (CLOCK_MONOTONIC seconds) decides instead of `since` where the daemon knows since_monotonic=;
    an older daemon that does not (400) is asked with since= alone."""
    deadline = time.monotonic() + timeout
    chunk_max = poll if poll is not None else LONG_POLL
    since_q = None if since is None else f"{since:.6f}"
    mono_q = None if since_mono is None else f"{since_mono:.6f}"

    def ready_path(target: str | None, **query: object) -> str:
        return _ready_path(target, since=since_q, since_monotonic=mono_q, **query)
    pause = 0.0  # > 0 while the daemon refuses long-polls: the next pause
    while True:
        left = max(0.0, deadline - time.monotonic())
        chunk = min(left, chunk_max)
        try:
            code, body = client.request(base, ready_path(target, wait=f"{chunk:.3f}"), timeout=chunk + 30)
            if code == 400 and mono_q is not None and "since_monotonic" in str(body):
                mono_q = None  # a genready from before since_monotonic=: the wall clock it is
                continue
            if refused(code, body):
                code, body = client.request(base, ready_path(target))
                pause = min(pause * 2, REFUSED_PAUSE[1]) if pause else REFUSED_PAUSE[0]
            else:
                pause = 0.0
        except client.Unreachable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                return Outcome(0, {"reason": f"genready unreachable: {e}"}, since, unreachable=str(e))
            if tick is not None:
                tick(0, {"reason": f"genready unreachable: {e}"})
            time.sleep(min(DAEMON_RETRY, left))
            continue
        if code != 503:
            return Outcome(code, body, since)
        failed = start_failed(body) if since is not None else None
        if failed is not None and on_failure is OnFailure.ANY and failed.get("restarting"):
            # Restarting, or just down (the daemon waits SETTLE to tell): one short look says which.
            with contextlib.suppress(client.Unreachable):
                code2, body2 = client.request(base, ready_path(target, wait=f"{SETTLE:.3f}"), timeout=SETTLE + 30)
                if code2 != 503:
                    return Outcome(code2, body2, since)
                body, failed = body2, start_failed(body2) or failed
        if failed is not None and (on_failure is OnFailure.ANY
                                   or (on_failure is OnFailure.FINAL and not failed.get("restarting"))):
            return Outcome(code, body, since, failed)
        if deadline - time.monotonic() <= 0:
            return Outcome(code, body, since, failed)
        if tick is not None:
            tick(code, body)
        if pause:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))


def restart_and_wait(restart: Callable[[], None], base: str, target: str, timeout: float, *,
                     on_failure: OnFailure = OnFailure.FINAL, poll: float | None = None,
                     tick: Callable[[int, Any], None] | None = None) -> Outcome:
    """Restart (`restart()`, which raises if systemd refuses), then wait for a verified start newer
    than the restart: `wait_ready` with since= (and since_monotonic=) the time taken just before
    systemd was asked."""
    # Compared with the new process's start: taken before asking systemd.
    since, since_mono = time.time(), time.monotonic()
    restart()
    return wait_ready(base, target, timeout, since, on_failure=on_failure, poll=poll, tick=tick, since_mono=since_mono)


def failure_lines(failed: Mapping[str, Any]) -> list[str]:
    """`Result=exit-code, exited with status 3`, then the start's last lines, each as `  | line`."""
    code = f", {failed['exit_code']} with status {failed.get('exit_status')}" if failed.get("exit_code") else ""
    return [f"Result={failed.get('result')}{code}", *(f"  | {line}" for line in failed.get("journal") or []),
            *(f"  GPU memory was held by a stray: {h.get('line')}" for h in failed.get("gpu_strays") or []
              if isinstance(h, dict))]

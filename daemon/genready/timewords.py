"""Times as genready writes them, one definition each: `iso()` for files and the API, `duration()`
for people (STATUS=, the CLI, the sweep's lines, the log), `ago()` and `local_time()` for the CLI;
`seconds_of()` reads a duration back as people write it (a sweep plan's `budget`); and the two clocks
the daemon reads (`Clock`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from genready.compat import UTC


@dataclass(frozen=True)
class Clock:
    """The daemon's two clocks. `wall()` (CLOCK_REALTIME) only for the times it shows and records
    (ISO 8601); `mono()` (CLOCK_MONOTONIC, the clock of systemd's *TimestampMonotonic properties)
    for every duration: load_seconds, how long a start has been loading, `stuck`, the expected
    load. A step of the wall clock (NTP, an operator, a VM resumed) changes no duration, state or
    expectation. Tests step the wall clock by giving a gate another Clock."""

    wall: Callable[[], float] = time.time
    mono: Callable[[], float] = time.monotonic


CLOCK = Clock()


def iso(ts: float | None) -> str | None:
    """Wall-clock seconds -> ISO 8601 with zone (the one time format of records, stamps and the API)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def from_iso(s: str | None) -> float | None:
    return None if s is None else datetime.fromisoformat(s).timestamp()


def duration(s: float | None) -> str:
    """Seconds as people read them: 4.2s, 42s, 3m10s, 6m02s, 1h05m ("?" if unknown)."""
    if s is None:
        return "?"
    if s < 10:
        return f"{max(0.0, s):.1f}s"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# "4h", "90m", "1h30m", "6m02s", "4.2s", "2d": what duration() writes, and what people write for a budget;
# each unit at most once, largest first, spaces allowed between the parts.
_DURATION = re.compile(r"\s*".join(rf"(?:(?P<{u}>\d+(?:\.\d+)?){u})?" for u in "dhms"))
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_WORDS = 'a duration such as "4h", "90m", "1h30m" or "45s" (or a number of seconds)'


def seconds_of(text: str | float) -> float:
    """A duration in seconds: `text` as duration() writes it or as people write one (DURATION_WORDS), or a
    number of seconds; ValueError when it is not one (the caller says which key or flag wanted it)."""
    if isinstance(text, bool):
        raise ValueError(f"boolean {text!r}")
    try:
        number = float(text)  # 3600 or "3600": seconds, as a number in a plan would be
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number):
            raise ValueError(repr(text)[:80])
        return number
    stripped = str(text).strip()
    m = _DURATION.fullmatch(stripped)
    if not stripped or m is None or not any(m.groupdict().values()):
        raise ValueError(repr(text)[:80])
    return sum(float(v) * _UNIT_SECONDS[u] for u, v in m.groupdict().items() if v is not None)


def ago(ts: float, now: float | None = None) -> str:
    """"12s ago", "3m ago", "2h ago", "4d ago"."""
    d = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= size:
            return f"{int(d // size)}{unit} ago"
    return f"{int(d)}s ago"


def local_time(iso: str | None, now: float | None = None) -> str:
    """An ISO 8601 time from the API as local time (with the date if not today) and how long ago."""
    if not iso:
        return "-"
    try:
        dt = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return iso
    now_dt = datetime.fromtimestamp(time.time() if now is None else now).astimezone()
    shown = dt.strftime("%H:%M:%S") if dt.date() == now_dt.date() else dt.strftime("%b %d %H:%M")
    return f"{shown} ({ago(dt.timestamp(), now_dt.timestamp())})"

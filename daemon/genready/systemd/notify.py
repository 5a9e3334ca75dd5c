"""Talking to systemd through the sd_notify protocol: ready, reloading, stopping, status, watchdog.

A thin wrapper over the `sdnotify` package whose methods speak systemd's own words. Every
method does nothing when genready does not run under systemd (NOTIFY_SOCKET unset) and
never raises: a notification that cannot be delivered is logged at debug level and the
daemon goes on, because a daemon must not die over its status line.

The protocol is one datagram of newline-separated KEY=VALUE assignments. STATUS= is one
line, so `status()` flattens multi-line text: each non-blank line is stripped and the lines
are joined with "; " (a stray "\\nREADY=1" inside a status text could otherwise be read by
systemd as an assignment of its own). Control characters are escaped as everywhere else
(`redact.escape`: `\\x1b`), a tab becomes a space, and the text is cut to STATUS_MAX_BYTES of
UTF-8 (ending in "…"), well below systemd's datagram limit.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Final

import sdnotify

from genready.redact import escape

log = logging.getLogger(__name__)

STATUS_MAX_BYTES: Final = 1024
STATUS_JOIN: Final = "; "
_ELLIPSIS: Final = "…"


def one_line(text: str, max_bytes: int = STATUS_MAX_BYTES) -> str:
    """`text` as one line for STATUS=: non-blank lines stripped and joined with "; ", control
    characters escaped (redact.escape), cut to `max_bytes` of UTF-8 ending in "…"."""
    lines = (escape(line.replace("\t", " ")).strip() for line in text.splitlines())
    flat = STATUS_JOIN.join(line for line in lines if line)
    raw = flat.encode("utf-8")
    if len(raw) <= max_bytes:
        return flat
    cut = raw[: max_bytes - len(_ELLIPSIS.encode("utf-8"))].decode("utf-8", errors="ignore")
    return cut + _ELLIPSIS


class Notifier:
    """genready's line to the service manager that started it (sd_notify(3)).

    The socket named by NOTIFY_SOCKET (a path, or "@name" for the abstract namespace) is
    connected on first use; after a failed send the next call connects anew, so a manager
    that re-executed itself is found again.
    """

    def __init__(self) -> None:
        self._notifier: sdnotify.SystemdNotifier | None = None

    @property
    def under_systemd(self) -> bool:
        """True when NOTIFY_SOCKET is set, i.e. a service manager listens for our notifications."""
        return bool(os.environ.get("NOTIFY_SOCKET"))

    def notify(self, *assignments: str) -> bool:
        """Send KEY=VALUE `assignments` as one datagram; True if it was sent.

        Does nothing (False) when not under systemd; never raises (a socket error is logged
        at debug and returns False). Values must already be single lines.
        """
        if not assignments or not self.under_systemd:
            return False
        message = "\n".join(assignments)
        try:
            if self._notifier is None:
                self._notifier = sdnotify.SystemdNotifier(debug=True)
            # sdnotify encodes str as Latin-1; systemd wants UTF-8. Handing it the UTF-8
            # bytes spelled as Latin-1 characters puts exactly those bytes on the wire.
            self._notifier.notify(message.encode("utf-8").decode("latin-1"))
        except Exception as e:  # sdnotify raises whatever socket/connect raised (debug=True)
            log.debug("sd_notify %r to %s failed: %s", message, os.environ.get("NOTIFY_SOCKET"), e)
            self._notifier = None  # connect afresh next time
            return False
        return True

    def ready(self, *, status: str | None = None) -> None:
        """READY=1: start-up (or a reload) finished; with `status`, STATUS= rides in the same datagram.
        Does nothing when not under systemd (NOTIFY_SOCKET unset)."""
        self.notify("READY=1", *self._status(status))

    def reloading(self, *, status: str | None = None) -> None:
        """RELOADING=1 (with MONOTONIC_USEC=, which Type=notify-reload on systemd ≥253 requires):
        re-establishing state; READY=1 ends it. Does nothing when not under systemd."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *self._status(status))

    def stopping(self, *, status: str | None = None) -> None:
        """STOPPING=1: shutting down. Does nothing when not under systemd (NOTIFY_SOCKET unset)."""
        self.notify("STOPPING=1", *self._status(status))

    def status(self, text: str) -> None:
        """STATUS=`text` flattened to one line (see `one_line`), shown by `systemctl status`;
        an empty text clears it. Does nothing when not under systemd (NOTIFY_SOCKET unset)."""
        self.notify(*self._status(text))

    def watchdog_ping(self) -> None:
        """WATCHDOG=1: still alive; send every `watchdog_interval()` seconds when that is not None.
        Does nothing when not under systemd (NOTIFY_SOCKET unset)."""
        self.notify("WATCHDOG=1")

    @staticmethod
    def watchdog_interval() -> float | None:
        """Seconds between watchdog pings: half of WATCHDOG_USEC when it is set (> 0) and meant
        for us (WATCHDOG_PID unset or our pid); None otherwise, including unparsable values."""
        usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
        if not usec:
            return None
        try:
            if pid is not None and int(pid) != os.getpid():
                return None
            value = int(usec)
        except ValueError:
            log.debug("ignoring unparsable WATCHDOG_USEC=%r / WATCHDOG_PID=%r", usec, pid)
            return None
        return value / 2_000_000 if value > 0 else None

    @staticmethod
    def _status(text: str | None) -> tuple[str, ...]:
        return () if text is None else (f"STATUS={one_line(text)}",)

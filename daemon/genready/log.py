"""Logging that reads well in the journal: one line per event, human words first, then key=value.

Under systemd, stderr goes to journald, which stamps each line itself and reads an sd-daemon
priority prefix (`<4>`), so lines carry the prefix and no timestamp. Elsewhere (a terminal, a
container's log file) lines carry a timestamp and the level name.

Probes fail every couple of seconds while a model loads; `Summarizer` keeps that to a handful of
lines: the first failure, then a count every minute and when the failure changes or clears.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TextIO

from genready.redact import escape

LOGGER_NAME: Final = "genready"

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def sd_priority(levelno: int) -> int:
    """The syslog priority journald should file a record of this logging level under."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class _EscapingFormatter(logging.Formatter):
    """A message is one line whatever it quotes (a server's reason phrase, a unit's output, a config
    value): its control characters, line breaks included, are escaped (redact.escape). Python's own
    traceback text is added after, as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


class JournalFormatter(_EscapingFormatter):
    """`<6>message`: every line prefixed, so a traceback's lines keep the record's priority
    (journald files each stream line separately; an unprefixed one would default to info)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{sd_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


class PlainFormatter(_EscapingFormatter):
    """`2026-11-29 10:01:02.123 WARNING message`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S")


def stream_is_journal(stream: TextIO) -> bool:
    """True if `stream` is the journal stream systemd connected us to.

    JOURNAL_STREAM ("<dev>:<inode>") is inherited by everything a service spawns, including a shell
    whose stderr is a terminal, so its mere presence is not enough: systemd.exec(5) says to compare
    it with the stream's device and inode.
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        # No file descriptor (a StringIO) or a malformed variable: not provably the journal.
        return False


def setup(level: str, *, journal: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure the "genready" logger; calling it again replaces the previous configuration.

    `level`: debug, info, warning or error (config's log_level). `journal`: None detects it from
    JOURNAL_STREAM; True/False force the journal or plain format. `stream`: default sys.stderr.
    """
    try:
        levelno = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(_LEVELS)}") from None
    out = stream if stream is not None else sys.stderr
    if journal is None:
        journal = stream_is_journal(out)
    handler = logging.StreamHandler(out)
    handler.setFormatter(JournalFormatter() if journal else PlainFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(levelno)
    # Our handler is the only one: a root handler (e.g. set up by a library) would print it twice.
    logger.propagate = False


def format_value(value: object) -> str:
    """A field value as it appears after `key=`: bare if it is one word, double-quoted otherwise."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # Seconds to the millisecond read better than 362.10000000000002; tiny values keep 3 digits.
        text = f"{value:.3f}".rstrip("0").rstrip(".") if value == 0 or abs(value) >= 0.001 else f"{value:.3g}"
    else:
        text = str(value)
    if text and not any(c.isspace() or c in '"=\\' for c in text) and escape(text) == text:
        return text
    escaped = escape(text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r"))
    return f'"{escaped}"'


def format_event(msg: str, **fields: object) -> str:
    """`msg key=value …`, fields in the order given."""
    if not fields:
        return msg
    return msg + " " + " ".join(f"{k}={format_value(v)}" for k, v in fields.items())


def event(logger: logging.Logger, level: int, msg: str, **fields: object) -> None:
    """Log one event as one line: `sglang: ready pid=4242 invocation=ab12cd34 load_seconds=362.1`."""
    if logger.isEnabledFor(level):
        # "%s" so a '%' in a message or value is text, not a format directive; stacklevel so the
        # record names the caller, not this helper.
        logger.log(level, "%s", format_event(msg, **fields), stacklevel=2)


@dataclass
class _Run:
    """Consecutive occurrences of one kind of trouble for one subject."""

    kind: str
    level: int
    window_start: float  # when the last line about this run (first occurrence or summary) was logged
    repeats: int = 0  # occurrences since then, not yet logged
    fields: dict[str, object] = field(default_factory=dict)  # the latest occurrence's fields


class Summarizer:
    """Logs the first of a series of identical troubles, then summaries instead of repeats.

    A subject (a target name) has at most one open run, keyed by kind (a failure class):

    * `note(subject, kind, msg, **fields)`: the first occurrence is logged as `msg fields`. Repeats
      of the same kind are counted; once `interval` seconds have passed since the last line about
      the run, the next repeat logs `subject: kind ×N in the last T s` plus the latest fields.
      A different kind closes the run (its summary, if repeats are pending) and logs the new one.
    * `flush(subject)` when the trouble clears (a probe succeeded, the unit stopped): logs the
      pending summary, and the next trouble is logged in full again.

    No timers: summaries are written from note()/flush(), which the probe loop calls anyway.
    For one event loop; not thread-safe.
    """

    def __init__(self, logger: logging.Logger, *, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._runs: dict[str, _Run] = {}

    def note(self, subject: str, kind: str, msg: str, *, level: int = logging.WARNING,
             **fields: object) -> bool:
        """Record one occurrence; True if a line was logged (the first occurrence or a summary)."""
        now = self.clock()
        run = self._runs.get(subject)
        if run is not None and run.kind == kind:
            run.repeats += 1
            run.fields = fields
            run.level = max(run.level, level)
            if now - run.window_start < self.interval:
                return False
            self._summarize(subject, run, now)
            run.window_start = now
            run.repeats = 0
            return True
        if run is not None:
            self._summarize(subject, run, now)
        self._runs[subject] = _Run(kind=kind, level=level, window_start=now, fields=fields)
        event(self.logger, level, msg, **fields)
        return True

    def flush(self, subject: str) -> bool:
        """Close the subject's run; True if a summary of pending repeats was logged."""
        run = self._runs.pop(subject, None)
        if run is None:
            return False
        return self._summarize(subject, run, self.clock())

    def flush_all(self) -> int:
        """Close every run (at shutdown); the number of summary lines logged."""
        return sum(self.flush(subject) for subject in list(self._runs))

    def pending(self, subject: str) -> int:
        """Repeats counted for the subject's open run but not yet logged."""
        run = self._runs.get(subject)
        return run.repeats if run is not None else 0

    def _summarize(self, subject: str, run: _Run, now: float) -> bool:
        if run.repeats == 0:
            return False
        span = now - run.window_start
        event(self.logger, run.level, f"{subject}: {run.kind} ×{run.repeats} in the last {span:.0f} s",
              **run.fields)
        return True

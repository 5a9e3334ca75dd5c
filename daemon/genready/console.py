"""The CLI's output to a terminal or pipe that may be gone: an exit status must not depend on it.

`genready wait … | head -c0`, `genready guard … 2>&-` or a log pipe whose reader died: a
write then fails (EPIPE, EBADF, ENOSPC on /dev/full), and Python would turn that into a
traceback (exit 1) or, at the final flush, exit 120. Nobody reads the text any more, so it is
dropped; what the command found out is still told by its exit status.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO

from genready.redact import escape


def ensure_std_fds() -> None:
    """Open /dev/null on any of fds 0-2 that is closed (`2>&-`), as daemons do: else the next
    socket or file opened takes that number, and a message (or a guarded command's output)
    would be written into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _silence(stream: TextIO) -> None:
    """Point the stream's fd at /dev/null: later writes and the interpreter's final flush succeed."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)


def write(text: str, stream: TextIO | None) -> None:
    """Write and flush `text`; a stream that is closed, a pipe nobody reads, or a full device
    swallows it (see the module doc)."""
    if stream is None:  # fd closed when Python started
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        _silence(stream)


def err(text: str) -> None:
    """One line to stderr (a newline is added). It may quote a server, a unit or a file: every control
    character in it is escaped (redact.escape), so it stays one line and cannot drive the terminal."""
    write(escape(text) + "\n", sys.stderr)


def out(text: str) -> None:
    """One line to stdout (a newline is added), escaped as err()'s."""
    write(escape(text) + "\n", sys.stdout)

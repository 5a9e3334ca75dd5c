"""Reading a file genready is pointed at but does not own (a config, a key, a unit's drop-in, a
results file): regular files only, bounded in size, never waiting on a FIFO nor reading a device.

The one bounded reader: everything that reads such a file goes through `read_file` (or
`read_regular`, for callers that say what a failure means themselves).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

_KINDS: Final = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                 (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def read_regular(path: str | Path, limit: int) -> bytes:
    """The content of a regular file of at most `limit` bytes. OSError if it cannot be read;
    ValueError saying what was found for anything else (a FIFO, a device, a bigger file)."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below, not read).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(next((name for is_kind, name in _KINDS if is_kind(mode)), "not a regular file"))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(limit + 1)  # the size can change while it is read: count what was read
    if len(raw) > limit:
        raise ValueError(f"a file of more than {limit:,} bytes")
    return raw


def size_words(n: int) -> str:
    """A byte count as people give a limit: 1 MiB, 64 KiB, 100 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"


class FileError(ValueError):
    """A file genready will not read, or read but cannot use: `FILE[:LINE]: problem`."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None) -> None:
        self.path, self.problem, self.line = str(path), problem, line
        super().__init__(f"{path}{f':{line}' if line else ''}: {problem}")


def read_file(path: str | Path, cap: int) -> bytes:
    """The content of a regular file of at most `cap` bytes, through read_regular (the one bounded
    reader: it never waits on a FIFO nor reads a device). FileNotFoundError as it is (callers treat a
    missing file as nothing to read); FileError naming the file for everything else."""
    try:
        return read_regular(path, cap)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise FileError(path, f"cannot read it: {e.strerror or e}") from None
    except ValueError as e:
        raise FileError(path, f"expected a regular file of at most {size_words(cap)}, found {e}") from None

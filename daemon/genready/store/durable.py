"""Files that survive a crash whole: atomic replace, synced append, and fsync of a directory.

Files genready writes for others to read go through here: the ready stamps and the running
file, the sweep's drop-ins, `genready init --write`'s config, the start records and the sweep's
results.jsonl (the bench client's `--output` lines do not yet: issue 36 §3). The rules, once:

- `replace()`: the new content goes to a temporary file beside the name (created O_EXCL and
  O_NOFOLLOW, so a link planted there is never written through), is fsync'd, given its mode (and
  owner, if asked) and renamed over the name; then the directory is fsync'd so the rename itself
  survives a crash. A reader (systemd on a reload, a .path unit, a parser) sees the old file or
  the new one, never half of one. A failure leaves the name as it was and no temporary file.
- `append()`: complete lines, one write and one fsync; a write that fails is cut back off the
  file, so no torn line glues itself to the next.
- `fsync_dir()`: a name created or renamed in a directory survives a crash only once the
  directory is synced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data`; a regular file only writes short on ENOSPC or a fatal signal."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def fsync_dir(path: str | Path) -> None:
    """Make a rename or create inside the directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_beside(path: Path, prefix: str | None) -> tuple[int, Path]:
    """A new file in `path`'s directory, opened read-write, mode 0600, never through a link."""
    for _ in range(100):
        tmp = path.with_name(f"{prefix if prefix is not None else f'.{path.name}.'}{os.urandom(6).hex()}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


def replace(path: str | Path, data: bytes, *, mode: int = 0o644, owner: tuple[int, int] | None = None,
            mkdir: bool = False, tmp_prefix: str | None = None, keep_open: bool = False) -> int | None:
    """Put `data` at `path` atomically (see the module docstring). The file gets `mode` exactly (no
    umask) and, with `owner` (uid, gid), that owner and group first (PermissionError if this process
    may not give them). `mkdir`: make missing parent directories. `tmp_prefix`: the temporary
    file's name before its random part (a caller that sweeps up leftovers names it).

    `keep_open`: return a read-write descriptor of the new file, in append mode (the start
    records keep appending to the file they just rewrote), and leave the directory's fsync to
    the caller, once it holds the descriptor (a failure then must not lose it); else None."""
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, tmp_prefix)
    try:
        write_all(fd, data)
        os.fsync(fd)
        if owner is not None:
            os.fchown(fd, *owner)  # before the mode: a chown clears set-id bits
        os.fchmod(fd, mode)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if keep_open:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        return fd
    os.close(fd)
    fsync_dir(path.parent)
    return None


def open_append(path: str | Path, mode: int = 0o644, *, read: bool = False, nofollow: bool = False) -> int:
    """A descriptor that appends to `path`, created (with `mode`, less the umask) if missing, its
    name then made durable. `read`: readable too. `nofollow`: a symlink at `path` fails (ELOOP)
    instead of being followed."""
    path = Path(path)
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    existed = path.exists()
    fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0), mode)
    if not existed:
        try:
            fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
    return fd


def append(fd: int, data: bytes) -> None:
    """Append `data` (complete lines) in one write and fsync it before returning. On failure the
    file is cut back to where it ended, so no torn line stays."""
    start = os.fstat(fd).st_size
    try:
        write_all(fd, data)  # one os.write in practice; O_APPEND puts it at the end
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def truncate(fd: int, size: int) -> None:
    """Cut the file behind `fd` to `size` bytes (a torn last line off), durably."""
    os.ftruncate(fd, size)
    os.fsync(fd)


def end_line(fd: int) -> None:
    """If the file behind `fd` ends inside a line (a crash mid-write), end that line, so the next
    append starts one of its own."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        append(fd, b"\n")

"""Ready stamps: `<runtime_dir>/<target>.ready`, present exactly while a start is verified.

A .path unit with PathChanged= on the stamp starts the benchmark once per verified start,
so the stamp is replaced atomically (one event, never a half-written file).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def stamp_path(runtime_dir: str | Path, target: str) -> Path:
    return Path(runtime_dir) / f"{target}.ready"


def write(runtime_dir: str | Path, target: str, data: dict[str, object]) -> Path:
    """Atomically (temp file in the same dir, fsync, rename) write the stamp of `target`."""
    path = stamp_path(runtime_dir, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp opens with O_CREAT|O_EXCL|O_NOFOLLOW and os.replace renames over a symlink rather
    # than through it: a link planted at either name never redirects the write.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{target}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=None, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove(runtime_dir: str | Path, target: str) -> None:
    """Remove the stamp of `target`, if there is one."""
    stamp_path(runtime_dir, target).unlink(missing_ok=True)


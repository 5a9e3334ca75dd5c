"""Ready stamps: `<runtime_dir>/<target>.ready`, present exactly while a start is verified.

A .path unit with PathChanged= on the stamp starts the benchmark once per verified start,
so the stamp is replaced atomically (one event, never a half-written file).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from genready.store import bounded, durable

# What the running daemon was started with (pid, config file, the settings only a restart
# changes), so `check-config` can say "restart needed". Target names cannot end in ".json".
RUNNING_FILE = "genready.json"


def stamp_path(runtime_dir: str | Path, target: str) -> Path:
    return Path(runtime_dir) / f"{target}.ready"


def write(runtime_dir: str | Path, target: str, data: dict[str, object]) -> Path:
    """Atomically write the stamp of `target`."""
    return write_json(stamp_path(runtime_dir, target), data)


def read_running(runtime_dir: str | Path) -> dict[str, object] | None:
    """The running daemon's RUNNING_FILE, if there is one and its pid lives; else None."""
    try:
        data = json.loads(bounded.read_file(Path(runtime_dir, RUNNING_FILE), 1 << 16))  # bounded, regular only
        alive = isinstance(data, dict) and Path(f"/proc/{int(data['pid'])}").exists()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data if alive else None


def write_json(path: Path, data: dict[str, object]) -> Path:
    """Atomically write `data` as JSON to `path`, mode 0644 (store/durable.py: a link planted at
    the name or beside it is never written through)."""
    durable.replace(path, (json.dumps(data, indent=None, sort_keys=True) + "\n").encode(), mode=0o644, mkdir=True)
    return path


def remove(runtime_dir: str | Path, target: str) -> None:
    """Remove the stamp of `target`, if there is one."""
    stamp_path(runtime_dir, target).unlink(missing_ok=True)



class Stamps:
    """What each target's stamp should be (its content, or absent), applied at once and retried
    until it holds. A stamp that cannot be written or removed (read-only or full runtime_dir) is
    reported through `on_error` and never raises into the gate: /ready, /status and the metrics
    come from the gate, so a failing stamp cannot make them disagree."""

    def __init__(self, runtime_dir: str | Path, on_error: Callable[[str, OSError, bool], None],
                 on_fixed: Callable[[str], None]) -> None:
        self.runtime_dir = runtime_dir
        self.on_error = on_error  # (target, error, first failure of this change?)
        self.on_fixed = on_fixed  # (target) after a failure, the stamp is as it should be again
        self._pending: dict[str, dict[str, object] | None] = {}  # target -> content not yet applied
        self._failing: set[str] = set()  # targets whose last attempt failed

    def set(self, target: str, data: dict[str, object] | None) -> None:
        """Make the stamp of `target` hold `data` (None: no stamp)."""
        self._pending[target] = data
        self._apply(target, first=True)

    @property
    def pending(self) -> list[str]:
        """Targets whose stamp is not yet what it should be."""
        return list(self._pending)

    def retry(self) -> None:
        for target in list(self._pending):
            self._apply(target, first=False)

    def _apply(self, target: str, *, first: bool) -> None:
        data = self._pending[target]
        try:
            if data is None:
                remove(self.runtime_dir, target)
            else:
                write(self.runtime_dir, target, data)
        except OSError as e:
            self._failing.add(target)
            self.on_error(target, e, first)
            return
        if self._pending.get(target) is data:
            del self._pending[target]
        if target in self._failing:
            self._failing.discard(target)
            self.on_fixed(target)

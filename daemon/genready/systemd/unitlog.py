"""A unit's own last words: the lines one start of it wrote, from its output files or the journal.

Used by `genready sweep` (a not_ready point's `journal`) and by the daemon (a failed start in
/status and `genready status`). Units may log to files (StandardOutput=append:… — these machines
have no journald) or to the journal; both are handled. Every line passes through `redact` first:
a server's output holds its API key (SGLang logs its whole ServerArgs at start).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from genready.redact import redact_lines

OUTPUT_LINES: Final = 20  # lines of a start's output kept: a not_ready sweep point, a failed start
JOURNALCTL_TIMEOUT: Final = 10.0


def output_files(fragment_path: str, dropin_paths: Sequence[str]) -> list[Path]:
    """Files the unit's stdout/stderr go to (StandardOutput=file:/append:/truncate:), from its unit files.

    systemd does not publish these paths on D-Bus, so they are read from the fragment and drop-ins
    it loaded; a path with a %-specifier is skipped rather than guessed.
    """
    settings: dict[str, str] = {}
    for path in (fragment_path, *dropin_paths):
        if not path:
            continue
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line:
                k, v = (x.strip() for x in line.split("=", 1))
                if k in ("StandardOutput", "StandardError"):
                    settings[k] = v
    out: list[Path] = []
    for v in settings.values():
        kind, _, where = v.partition(":")
        if kind in ("file", "append", "truncate") and where.startswith("/") and "%" not in where:
            out.append(Path(where))
    return list(dict.fromkeys(out))


@dataclass
class OutputMark:
    """Where the unit's output stood when a start began, to show only that start's lines."""

    since: float
    sizes: dict[Path, int] = field(default_factory=dict)

    @classmethod
    def take(cls, fragment_path: str, dropin_paths: Sequence[str], since: float | None = None) -> OutputMark:
        sizes = {}
        for p in output_files(fragment_path, dropin_paths):
            with contextlib.suppress(OSError):
                sizes[p] = p.stat().st_size
            sizes.setdefault(p, 0)
        return cls(time.time() if since is None else since, sizes)

    def lines(self, bus_kind: str, unit: str, n: int = OUTPUT_LINES, secrets: Iterable[str] = ()) -> list[str]:
        """The last `n` lines the unit wrote since the mark, secrets masked: from its output files,
        else from the journal. Blocking (file reads, journalctl): the daemon calls it off its loop."""
        return redact_lines(self._raw(bus_kind, unit, n), secrets)

    def _raw(self, bus_kind: str, unit: str, n: int) -> list[str]:
        if self.sizes:
            out: list[str] = []
            for p, size in self.sizes.items():
                try:
                    with p.open("rb") as f:
                        if os.fstat(f.fileno()).st_size >= size:  # a truncate: file starts again from 0
                            f.seek(size)
                        out += f.read().decode(errors="replace").splitlines()
                except OSError:
                    continue
            return out[-n:]
        cmd = ["journalctl", "--user-unit" if bus_kind == "user" else "--unit", unit, "--since",
               f"@{int(self.since)}", "-o", "cat", "-n", str(n), "--no-pager", "-q"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=JOURNALCTL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return done.stdout.splitlines()[-n:] if done.returncode == 0 else []
